package offsets

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/streamfile"
)

// formatVersion is the sidecar format this package writes. It reads
// devVersion too.
const formatVersion = 2

// devVersion is the format before formatVersion, which also stored the
// device number of each position's file. That number can change at a
// reboot (see [streamfile.Identity]); a sidecar of this version is read
// with it checked to be there and ignored, so that its positions apply to
// their files whatever their device numbers are now.
const devVersion = 1

// CorruptError reports a sidecar that cannot be decoded. Open and Load
// return it instead of starting from empty positions, and leave the file
// as it is.
type CorruptError struct {
	// Path is the sidecar file.
	Path string
	// Err says what is wrong with it.
	Err error
	// Marker is the state directory's marker file ([Options.Marker]) if
	// it exists (or cannot be checked), else "". A sidecar moved aside
	// without it is a [*MissingError] at the next Open, so the advice
	// names it too.
	Marker string
}

func (e *CorruptError) Error() string {
	if ne, ok := errors.AsType[*newerError](e.Err); ok {
		return fmt.Sprintf("offsets: sidecar %s is of version %d, written by a newer streamd: run that "+
			"version, or stop and restore the sidecar of before the upgrade (the records since then are "+
			"delivered again); see \"Upgrade and roll back\" in the README", e.Path, ne.version)
	}
	if e.Marker == "" {
		return fmt.Sprintf("offsets: corrupt sidecar %s: %v (move the file aside to start every "+
			"subscription from its start_at, or restore it from a backup; \"streamd offsets set\" "+
			"can then rewrite a position)", e.Path, e.Err)
	}
	return fmt.Sprintf("offsets: corrupt sidecar %s: %v (restore it from a backup; or move it aside "+
		"together with %s to start every subscription from its start_at, as on a first start, dropping "+
		"what %s holds; or move it aside alone and store each subscription's position with "+
		"\"streamd offsets set --subscription=NAME --to=POSITION\", which writes a new sidecar, a "+
		"subscription left out starting at its start_at)", e.Path, e.Err, e.Marker, e.Marker)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// newerError is a sidecar of a version after formatVersion: not damage,
// but the file of a newer streamd, which a rollback must not move aside.
type newerError struct{ version int64 }

func (e *newerError) Error() string {
	return fmt.Sprintf("unsupported version %d, this streamd reads versions %d and %d", e.version, devVersion, formatVersion)
}

// MissingError reports a state directory that has been used, as its marker
// file shows ([Options.Marker]), but has no sidecar: where each
// subscription resumes is unknown. Open returns it instead of starting
// every subscription from its start_at, which would skip or replay
// records. Path is the missing sidecar, Marker the file that shows the
// directory was used.
type MissingError struct{ Path, Marker string }

func (e *MissingError) Error() string {
	return fmt.Sprintf("offsets: sidecar %s is missing, but %s shows that the state directory was used: "+
		"where each subscription resumes is unknown, and starting from start_at would skip or replay records "+
		"(restore the sidecar from a backup; or store the position of each subscription with "+
		"\"streamd offsets set --subscription=NAME --to=POSITION\", which creates it; or delete %s "+
		"to start afresh, as on a first start, dropping what it holds)", e.Path, e.Marker, e.Marker)
}

// The JSON shape of a sidecar, version 2 and, with the dev field,
// version 1. sidecarShape must list the same keys.
type (
	fileJSON struct {
		Version       int                  `json:"version"`
		Subscriptions map[string]entryJSON `json:"subscriptions"`
	}
	entryJSON struct {
		Stream      string       `json:"stream"`
		File        identityJSON `json:"file"`
		Offset      int64        `json:"offset"`
		LastSeq     uint64       `json:"last_seq"`
		CommittedAt string       `json:"committed_at"`
	}
	identityJSON struct {
		// Dev is version 1's device number: read, and ignored; never
		// written (left zero, it is omitted).
		Dev         uint64 `json:"dev,omitempty"`
		Ino         uint64 `json:"ino"`
		FileName    string `json:"file_name"`
		CreatedAtMs uint64 `json:"created_at_ms"`
	}
)

// identityJSONOf is id in the shape the files store it.
func identityJSONOf(id streamfile.Identity) identityJSON {
	return identityJSON{Ino: id.Ino, FileName: id.FileName, CreatedAtMs: id.CreatedAtMs}
}

// identity is the file identity j stores.
func (j identityJSON) identity() streamfile.Identity {
	return streamfile.Identity{Ino: j.Ino, FileName: j.FileName, CreatedAtMs: j.CreatedAtMs}
}

// shape gives the keys of the objects of a JSON file shaped as a sidecar
// and a settled file both are: a version and subscriptions by name, each
// an object with entry's keys, among them a file object with file's keys.
type shape struct{ entry, file []string }

// at returns the keys the object at path must have, all of them and no
// other, and whether path is an object of the format at all. The
// subscriptions object takes any key (nil).
func (f shape) at(path []string) ([]string, bool) {
	switch {
	case len(path) == 0:
		return []string{"version", "subscriptions"}, true
	case path[0] != "subscriptions":
		return nil, false
	case len(path) == 1:
		return nil, true
	case len(path) == 2:
		return f.entry, true
	case len(path) == 3 && path[2] == "file":
		return f.file, true
	}
	return nil, false
}

// sidecarShape returns the keys of a sidecar of the version.
func sidecarShape(version int64) shape {
	f := shape{
		entry: []string{"stream", "file", "offset", "last_seq", "committed_at"},
		file:  []string{"ino", "file_name", "created_at_ms"},
	}
	if version == devVersion {
		f.file = append([]string{"dev"}, f.file...)
	}
	return f
}

// encode returns the sidecar holding positions, which Set or decode has
// checked: indented JSON with the subscriptions sorted by name, ending in a
// newline.
func encode(positions map[string]Position) ([]byte, error) {
	file := fileJSON{Version: formatVersion, Subscriptions: make(map[string]entryJSON, len(positions))}
	for name, p := range positions {
		file.Subscriptions[name] = entryJSON{
			Stream:      p.Stream,
			File:        identityJSONOf(p.File),
			Offset:      p.Offset,
			LastSeq:     p.LastSeq,
			CommittedAt: p.CommittedAt.UTC().Format(time.RFC3339Nano),
		}
	}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// decode parses a sidecar strictly: one JSON object and nothing after it,
// version 2 or 1, every field of that version present once and no other,
// no null, no negative offset. Its errors say what is wrong without naming
// the file.
func decode(data []byte) (map[string]Position, error) {
	raw, err := parseObject(data)
	if err != nil {
		return nil, err
	}

	// The version comes first, so that a file from a newer streamd is
	// reported as such rather than by its first unknown field.
	var top struct {
		Version       json.RawMessage `json:"version"`
		Subscriptions json.RawMessage `json:"subscriptions"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, err
	}
	if top.Version == nil {
		return nil, fieldError([]string{"version"}, "missing")
	}
	version, err := strconv.ParseInt(string(top.Version), 10, 64)
	if err != nil {
		return nil, fieldError([]string{"version"}, fmt.Sprintf("%s, want an integer", top.Version))
	}
	if version != formatVersion && version != devVersion {
		if version > formatVersion {
			return nil, &newerError{version}
		}
		return nil, fmt.Errorf("unsupported version %d, this streamd reads versions %d and %d", version, devVersion, formatVersion)
	}
	if err := checkKeys(raw, sidecarShape(version)); err != nil {
		return nil, err
	}

	var subs map[string]json.RawMessage
	if err := decodeStrict(top.Subscriptions, &subs); err != nil {
		return nil, fieldError([]string{"subscriptions"}, err.Error())
	}
	positions := make(map[string]Position, len(subs))
	for _, name := range slices.Sorted(maps.Keys(subs)) {
		var e entryJSON
		if err := decodeStrict(subs[name], &e); err != nil {
			return nil, fieldError([]string{"subscriptions", name}, err.Error())
		}
		p, err := e.position(name)
		if err != nil {
			return nil, err
		}
		positions[name] = p
	}
	return positions, nil
}

func (e entryJSON) position(name string) (Position, error) {
	var committedAt time.Time
	if err := committedAt.UnmarshalText([]byte(e.CommittedAt)); err != nil {
		return Position{}, fieldError([]string{"subscriptions", name, "committed_at"},
			fmt.Sprintf("%q, want an RFC 3339 time", e.CommittedAt))
	}
	// encode writes UTC, and a UTC year outside 0-9999 could not be read
	// back.
	committedAt = committedAt.UTC()
	if y := committedAt.Year(); y < 0 || y > 9999 {
		return Position{}, fieldError([]string{"subscriptions", name, "committed_at"},
			fmt.Sprintf("%q is out of range", e.CommittedAt))
	}
	p := Position{
		Stream:      e.Stream,
		File:        e.File.identity(),
		Offset:      e.Offset,
		LastSeq:     e.LastSeq,
		CommittedAt: committedAt,
	}
	return p, p.check(name)
}

// parseObject returns the one JSON object that data holds, with nothing
// after it but white space, and names what else it holds: the damage of a
// crash (see checkBytes), invalid or cut-short JSON, another value.
func parseObject(data []byte) (json.RawMessage, error) {
	if err := checkBytes(data); err != nil {
		return nil, err
	}
	var raw json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	switch err := dec.Decode(&raw); {
	case errors.Is(err, io.EOF):
		return nil, errors.New("no JSON value, only white space")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, fmt.Errorf("JSON ends early at byte %d, likely a torn write", len(data))
	case err != nil:
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return nil, fmt.Errorf("invalid JSON at byte %d: %v", syntax.Offset, syntax)
		}
		return nil, err
	}
	if rest := bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return nil, fmt.Errorf("unexpected data after the JSON object at byte %d", len(data)-len(rest))
	}
	if raw[0] != '{' {
		return nil, errors.New("the JSON value is not an object")
	}
	return raw, nil
}

// checkBytes reports the damage a crash leaves that is best named before
// any JSON parsing: nothing at all, NUL bytes. It also refuses a file too
// large to be a sidecar.
func checkBytes(data []byte) error {
	if len(data) == 0 {
		return errors.New("the file is empty, likely a write lost in a crash")
	}
	if len(data) > maxSidecarSize {
		return fmt.Errorf("larger than %d bytes, the most the file may hold", maxSidecarSize)
	}
	if i := bytes.IndexByte(data, 0); i >= 0 {
		if len(bytes.Trim(data, "\x00")) == 0 {
			return fmt.Errorf("all %d bytes are NUL, likely a write lost in a crash", len(data))
		}
		return fmt.Errorf("NUL byte at offset %d, likely a torn write", i)
	}
	return nil
}

// decodeStrict decodes the JSON value raw into v, rejecting fields v does
// not have, and rewords the type errors of encoding/json, which name Go
// types.
func decodeStrict(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var typeErr *json.UnmarshalTypeError
	if !errors.As(err, &typeErr) {
		return err
	}
	problem := fmt.Sprintf("%s, want %s", typeErr.Value, jsonKind(typeErr.Type))
	if typeErr.Field == "" {
		return errors.New(problem)
	}
	return fmt.Errorf("field %q: %s", typeErr.Field, problem)
}

// jsonKinds names the JSON value a Go value of each kind in the format
// takes; any other kind (a struct) takes an object.
var jsonKinds = map[reflect.Kind]string{
	reflect.Int64:  "an integer",
	reflect.Uint64: "a non-negative integer",
	reflect.String: "a string",
}

// jsonKind names the JSON value a Go type of the format takes.
func jsonKind(t reflect.Type) string {
	if k, ok := jsonKinds[t.Kind()]; ok {
		return k
	}
	return "an object"
}

// fieldError describes a problem with the value at path, keys from the
// top of the file.
func fieldError(path []string, problem string) error {
	switch {
	case len(path) >= 2 && path[0] == "subscriptions":
		if len(path) == 2 {
			return fmt.Errorf("subscription %q: %s", path[1], problem)
		}
		return fmt.Errorf("subscription %q: field %q: %s", path[1], strings.Join(path[2:], "."), problem)
	default:
		return fmt.Errorf("field %q: %s", strings.Join(path, "."), problem)
	}
}

// checkKeys walks the objects of raw, which must be valid JSON, and
// reports the first key that is repeated, unknown or missing in the format
// whose keys f gives, and any null where the format wants a value. encoding/json would keep the last of two equal
// keys, match keys case-insensitively and read null as zero, all without
// a word.
func checkKeys(raw json.RawMessage, f shape) error {
	type frame struct {
		path    []string        // keys from the top to this container
		object  bool            // an object, not an array
		known   bool            // an object of the format: its keys are checked
		fields  []string        // the keys it must have; nil: any key
		seen    map[string]bool // keys so far
		key     string          // the last key
		wantKey bool            // the next token is a key or the end
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		var path []string // of the value tok starts, if it starts one
		if len(stack) > 0 {
			top = stack[len(stack)-1]
			path = top.path
			if top.object {
				path = append(slices.Clip(top.path), top.key)
			}
		}
		if top != nil && top.wantKey {
			if key, ok := tok.(string); ok {
				keyPath := append(slices.Clip(top.path), key)
				if top.seen[key] {
					return fieldError(keyPath, "appears twice")
				}
				if top.known && top.fields != nil && !slices.Contains(top.fields, key) {
					return fieldError(keyPath, "unknown")
				}
				top.seen[key] = true
				top.key = key
				top.wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			fields, known := f.at(path)
			stack = append(stack, &frame{
				path:    path,
				object:  tok == json.Delim('{'),
				known:   known && tok == json.Delim('{'),
				fields:  fields,
				seen:    map[string]bool{},
				wantKey: tok == json.Delim('{'),
			})
			continue
		case json.Delim('}'):
			if top.known {
				for _, field := range top.fields {
					if !top.seen[field] {
						return fieldError(append(slices.Clip(top.path), field), "missing")
					}
				}
			}
			stack = stack[:len(stack)-1]
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
		case nil:
			if top != nil && top.known {
				return fieldError(path, "null value")
			}
		}
		// A value ended: a scalar, or the container just closed.
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true
		}
	}
}
