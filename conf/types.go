package conf

import (
	"encoding"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/tail"
)

var (
	configType      = reflect.TypeFor[Config]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checkTypes checks the value v decoded from the file at p against the Go
// type t of the field it fills: a table's keys must be the exact toml tags
// of t's fields, values must have the field's type, and text the field
// parses (a duration, a position) must parse. A key that is not a field is
// reported once, without looking inside it.
func (l *loader) checkTypes(v any, t reflect.Type, p keyPath) {
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		s, ok := v.(string)
		if !ok {
			l.typeError(p, t, v)
			return
		}
		if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
			l.errorf(p, "%v", err)
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		l.checkTypes(v, t.Elem(), p)
	case reflect.String:
		if _, ok := v.(string); !ok {
			l.typeError(p, t, v)
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			l.typeError(p, t, v)
		}
	case reflect.Int:
		n, ok := v.(int64)
		if !ok {
			l.typeError(p, t, v)
		} else if n < math.MinInt || n > math.MaxInt {
			l.errorf(p, "%d is out of range", n)
		}
	case reflect.Slice:
		switch a := v.(type) {
		case []any:
			for i, e := range a {
				l.checkTypes(e, t.Elem(), p.i(i))
			}
		case []map[string]any: // an array of [[tables]]
			for i, e := range a {
				l.checkTypes(e, t.Elem(), p.i(i))
			}
		default:
			l.typeError(p, t, v)
		}
	case reflect.Map: // string keys: headers, env
		m, ok := v.(map[string]any)
		if !ok {
			l.typeError(p, t, v)
			return
		}
		for k, e := range m {
			l.checkTypes(e, t.Elem(), p.k(k))
		}
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			l.typeError(p, t, v)
			return
		}
		for k, e := range m {
			if f, ok := fieldByTag(t, k); ok {
				l.checkTypes(e, f.Type, p.k(k))
			} else {
				what := "key"
				switch e.(type) {
				case map[string]any, []map[string]any:
					what = "table"
				}
				l.errorf(p.k(k), "unknown %s%s", what, suggest(t, p, k))
			}
		}
	default:
		panic("daemon: configuration field of unsupported type " + t.String())
	}
}

// keyFields returns the fields of t, a table of the configuration, that
// are its keys: the exported ones (Config keeps where its file writes them
// in an unexported field).
func keyFields(t reflect.Type) []reflect.StructField {
	var fields []reflect.StructField
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() {
			fields = append(fields, f)
		}
	}
	return fields
}

func fieldByTag(t reflect.Type, key string) (reflect.StructField, bool) {
	for _, f := range keyFields(t) {
		if f.Tag.Get("toml") == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// suggest names the key of t, the table at p, that an unknown key was
// probably meant to be, or the table below it that has the key.
func suggest(t reflect.Type, p keyPath, key string) string {
	for _, f := range keyFields(t) {
		tag := f.Tag.Get("toml")
		if strings.EqualFold(tag, key) {
			return fmt.Sprintf("; keys are case-sensitive: did you mean %q?", tag)
		}
	}
	for _, f := range keyFields(t) {
		tag := f.Tag.Get("toml")
		limit := max(1, len(key)/4)
		if abs(len(tag)-len(key)) <= limit && editDistance(tag, key) <= limit || strings.HasPrefix(tag, key+"_") {
			return fmt.Sprintf("; did you mean %q?", tag)
		}
	}
	// A key of a table one level down, written a level too high: a
	// handler's timeout in [[subscription]], say.
	for _, f := range keyFields(t) {
		if f.Type.Kind() == reflect.Struct {
			if _, ok := fieldByTag(f.Type, key); ok {
				return fmt.Sprintf("; it is a key of the [%s] table", p.k(f.Tag.Get("toml")).table())
			}
		}
	}
	return ""
}

func abs(n int) int { return max(n, -n) }

// editDistance is the optimal string alignment distance between a and b:
// the insertions, deletions, substitutions and swaps of adjacent bytes that
// turn one into the other.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

func (l *loader) typeError(p keyPath, t reflect.Type, v any) {
	l.errorf(p, "must be %s, not %s", describeType(t), describeValue(v))
}

// describeType says what a value of a field of type t is written as.
func describeType(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[Duration]():
		return `a duration string such as "5s"`
	case reflect.TypeFor[FileMode]():
		return `an octal mode string such as "0640"`
	case reflect.TypeFor[tail.Start]():
		return "a position string: " + tail.StartForms
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int:
		return "an integer"
	case reflect.Slice:
		return "an array"
	}
	return "a table"
}

// describeValue says what a value decoded from TOML is.
func describeValue(v any) string {
	switch x := v.(type) {
	case string:
		if len(x) > 40 {
			x = x[:40] + "..."
		}
		return "the string " + strconv.Quote(x)
	case int64:
		return fmt.Sprintf("the integer %d", x)
	case float64:
		return fmt.Sprintf("the float %v", x)
	case bool:
		return fmt.Sprintf("%v", x)
	case []any, []map[string]any:
		return "an array"
	case map[string]any:
		return "a table"
	case time.Time: // also a local date, time or date-time
		return "a date or time"
	}
	return fmt.Sprintf("a %T", v)
}
