package envelope

import (
	"fmt"
	"slices"
	"strings"
)

// Header is one named header value. Names are ASCII-lowercased; values are
// arbitrary bytes.
type Header struct {
	Name  string
	Value []byte
}

// Headers is an ordered header map: names are ASCII-lowercased on insert,
// iteration follows insertion order, and setting an existing name replaces its
// value in place (settlement.md §1).
type Headers []Header

// Get returns the value of name and whether it is present.
func (h Headers) Get(name string) ([]byte, bool) {
	name = lowerASCII(name)
	for _, e := range h {
		if e.Name == name {
			return e.Value, true
		}
	}
	return nil, false
}

// Set inserts name=value, replacing an existing value in place.
func (h *Headers) Set(name string, value []byte) {
	h.set(lowerASCII(name), value)
}

// set is Set for a name already lowercased.
func (h *Headers) set(name string, value []byte) {
	for i := range *h {
		if (*h)[i].Name == name {
			(*h)[i].Value = value
			return
		}
	}
	*h = append(*h, Header{Name: name, Value: value})
}

// Delete removes name, if present, keeping the order of the others.
func (h *Headers) Delete(name string) {
	name = lowerASCII(name)
	*h = slices.DeleteFunc(*h, func(e Header) bool { return e.Name == name })
}

// Clone returns a deep copy of h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	out := make(Headers, len(h))
	for i, e := range h {
		out[i] = Header{Name: e.Name, Value: append([]byte(nil), e.Value...)}
	}
	return out
}

// lowerASCII lowercases ASCII letters only, leaving other bytes untouched.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return strings.Map(func(r rune) rune {
				if 'A' <= r && r <= 'Z' {
					return r + ('a' - 'A')
				}
				return r
			}, s)
		}
	}
	return s
}

// ParseHeader parses a header written name=value, as a command line gives
// one (streamd publish --header).
func ParseHeader(text string) (name string, value []byte, err error) {
	switch name, value, ok := strings.Cut(text, "="); {
	case !ok:
		return "", nil, fmt.Errorf("header %q has no '=': write name=value", text)
	case name == "":
		return "", nil, fmt.Errorf("header %q has an empty name", text)
	default:
		return name, []byte(value), nil
	}
}
