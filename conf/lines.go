package conf

import (
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// keyPath is the path of a value in a configuration file: keys and array
// indexes, written like subscription[1].handler.url.
type keyPath []pathElem

type pathElem struct {
	key     string
	index   int
	isIndex bool
}

// k returns the path of key name inside the table at p.
func (p keyPath) k(name string) keyPath {
	return append(p[:len(p):len(p)], pathElem{key: name})
}

// i returns the path of element n of the array at p.
func (p keyPath) i(n int) keyPath {
	return append(p[:len(p):len(p)], pathElem{index: n, isIndex: true})
}

// table returns the name of the table at p as its header writes it,
// without the indexes of arrays of tables: subscription.handler.
func (p keyPath) table() string {
	var keys []string
	for _, e := range p {
		if !e.isIndex {
			keys = append(keys, toml.Key{e.key}.String())
		}
	}
	return strings.Join(keys, ".")
}

func (p keyPath) String() string {
	var b strings.Builder
	for _, e := range p {
		if e.isIndex {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(e.index))
			b.WriteByte(']')
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(toml.Key{e.key}.String()) // quoted when it is not a bare key
	}
	return b.String()
}

// lineMap holds the line of every key of a document, by its path with array
// indexes (subscription[1].key). The TOML decoder keeps key positions to
// itself, so they are found again by [scanKeys].
type lineMap map[string]int

// newLineMap maps the keys of md, decoded from src into tree, to their
// lines. When the scan of src does not find the keys md lists, it maps
// nothing rather than something wrong, and errors go without line numbers.
func newLineMap(src string, md *toml.MetaData, tree map[string]any) lineMap {
	lines := lineMap{}
	for _, k := range keyPaths(src, md, tree) {
		// A table, array or element without a line of its own (a = [{b = 1}],
		// a.b = 1, [[a]]) is where it first appears.
		for n := range k.path {
			lines.add(k.path[:n+1], k.line)
		}
	}
	return lines
}

// keyLine is the path and line of one key of a document.
type keyLine struct {
	path keyPath // nil when not found in the tree
	line int
}

// keyPaths returns the path with array indexes and the line of each key
// md.Keys lists, or nil when the scan of src does not find them. The index
// in an array of [[tables]] comes from counting its headers, the indexes in
// inline arrays from the scan.
func keyPaths(src string, md *toml.MetaData, tree map[string]any) []keyLine {
	keys := md.Keys()
	locs := scanKeys(src)
	if len(locs) != len(keys) {
		return nil
	}
	out := make([]keyLine, len(keys))
	headers := map[string]int{} // [[table]] headers seen, by the array's path
	for n, key := range keys {
		out[n] = keyLine{path: keyPathOf(key, locs[n], tree, headers), line: locs[n].line}
	}
	return out
}

// keyPathOf finds the path of key, found by the scan at loc, in tree.
func keyPathOf(key toml.Key, loc keyLoc, tree map[string]any, headers map[string]int) keyPath {
	groups := loc.elems
	var p keyPath
	var v any = tree
	for j, name := range key {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v, p = m[name], p.k(name)
		last := j == len(key)-1
		switch a := v.(type) {
		case []map[string]any: // an array of [[tables]]
			if last && loc.header {
				headers[p.String()]++
			}
			i := headers[p.String()] - 1
			if i < 0 || i >= len(a) {
				return nil
			}
			v, p = a[i], p.i(i)
		case []any: // an inline array: of tables when keys lie below it
			if last {
				break
			}
			if len(groups) == 0 {
				return nil
			}
			for _, i := range groups[0] {
				e, ok := v.([]any)
				if !ok || i >= len(e) {
					return nil
				}
				v, p = e[i], p.i(i)
			}
			groups = groups[1:]
		}
	}
	return p
}

// add maps p to line unless it is already mapped.
func (m lineMap) add(p keyPath, line int) {
	if _, ok := m[p.String()]; !ok {
		m[p.String()] = line
	}
}

// line returns the line of p, or of the closest table that holds it when p
// itself is not written in the file (a missing key, an array element), or 0.
func (m lineMap) line(p keyPath) int {
	for n := len(p); n > 0; n-- {
		if l, ok := m[p[:n].String()]; ok {
			return l
		}
	}
	return 0
}

// keyLoc is where [scanKeys] found a key.
type keyLoc struct {
	line   int
	header bool // a [table] or [[array]] header
	// elems holds, for each enclosing inline table that is in an array,
	// outermost first, its index and those of the arrays around it up to
	// the table before: a = [[{b = 1}]] gives b the group [0 0].
	elems [][]int
}

// scanKeys finds the keys of the TOML document src in the order
// [toml.MetaData.Keys] lists them: one for each table header and one for
// each "=" outside strings and comments (a key and its "=" share a line).
// src must be valid TOML.
func scanKeys(src string) []keyLoc {
	s := scanner{src: src, line: 1}
	switch { // the decoder skips a byte order mark
	case strings.HasPrefix(src, "\xef\xbb\xbf"):
		s.i = 3
	case strings.HasPrefix(src, "\xff\xfe"), strings.HasPrefix(src, "\xfe\xff"):
		s.i = 2
	}
	for s.i < len(s.src) {
		switch s.src[s.i] {
		case '\n':
			s.line++
			s.i++
		case ' ', '\t', '\r':
			s.i++
		case '#':
			s.skipLine()
		case '[':
			s.locs = append(s.locs, keyLoc{line: s.line, header: true})
			s.skipLine() // a header is one line, then at most a comment
		default:
			s.statement()
		}
	}
	return s.locs
}

type scanner struct {
	src  string
	i    int
	line int
	locs []keyLoc
}

func (s *scanner) skipLine() {
	if n := strings.IndexByte(s.src[s.i:], '\n'); n >= 0 {
		s.i += n
	} else {
		s.i = len(s.src)
	}
}

// statement scans a key = value statement up to the newline that ends it,
// which may be several lines down in an array or inline table.
func (s *scanner) statement() {
	type frame struct {
		array  bool
		commas int // in an array: elements before the current one
		index  int // index in the enclosing array, or -1
	}
	var stack []frame
	open := func(array bool) {
		index := -1
		if n := len(stack); n > 0 && stack[n-1].array {
			index = stack[n-1].commas
		}
		stack = append(stack, frame{array: array, index: index})
		s.i++
	}
	for s.i < len(s.src) {
		switch s.src[s.i] {
		case '\n':
			if len(stack) == 0 {
				return
			}
			s.line++
			s.i++
		case '#':
			s.skipLine()
		case '"':
			s.quoted('"', true)
		case '\'':
			s.quoted('\'', false)
		case '[':
			open(true)
		case '{':
			open(false)
		case ']', '}':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			s.i++
		case ',':
			if n := len(stack); n > 0 && stack[n-1].array {
				stack[n-1].commas++
			}
			s.i++
		case '=':
			var groups [][]int
			var group []int
			for _, f := range stack {
				if f.index >= 0 {
					group = append(group, f.index)
				}
				if !f.array {
					if len(group) > 0 {
						groups = append(groups, group)
					}
					group = nil
				}
			}
			s.locs = append(s.locs, keyLoc{line: s.line, elems: groups})
			s.i++
		default:
			s.i++
		}
	}
}

// quoted skips a string quoted with q: basic ("), with backslash escapes,
// or literal ('), and their multi-line forms.
func (s *scanner) quoted(q byte, escapes bool) {
	multi := strings.HasPrefix(s.src[s.i:], string([]byte{q, q, q}))
	if multi {
		s.i += 3
	} else {
		s.i++
	}
	for s.i < len(s.src) {
		c := s.src[s.i]
		switch {
		case c == '\n':
			if !multi {
				return // not valid TOML; leave the newline to the statement
			}
			s.line++
			s.i++
		case c == '\\' && escapes:
			if s.i+1 < len(s.src) && s.src[s.i+1] == '\n' { // a line-ending backslash
				s.line++
			}
			s.i += 2
		case c == q && !multi:
			s.i++
			return
		case c == q:
			// A multi-line string ends at three quotes, and takes up to two
			// more before them as content.
			run := 0
			for s.i < len(s.src) && s.src[s.i] == q {
				run++
				s.i++
			}
			if run >= 3 {
				return
			}
		default:
			s.i++
		}
	}
}
