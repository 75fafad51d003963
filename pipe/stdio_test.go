package pipe

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestReader(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // longer than the read buffer
	tests := []struct {
		name         string
		in           string
		want         []string
		unterminated bool // the last line
	}{
		{"empty input", "", nil, false},
		{"lines", "a\nb\n", []string{"a", "b"}, false},
		{"last line without newline", "a\nb", []string{"a", "b"}, true},
		{"empty lines", "\n\na\n", []string{"", "", "a"}, false},
		{"carriage return kept", "a\r\n", []string{"a\r"}, false},
		{"line longer than the buffer", long + "\nz\n", []string{long, "z"}, false},
		{"longer than the buffer, without newline", "z\n" + long, []string{"z", long}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReader(strings.NewReader(tt.in))
			var got []string
			for {
				line, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if cut := r.Unterminated(); cut != (tt.unterminated && len(got) == len(tt.want)-1) {
					t.Errorf("line %d unterminated: %v", len(got)+1, cut)
				}
				got = append(got, string(line))
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d lines, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("line %d = %.20q, want %.20q", i, got[i], tt.want[i])
				}
			}
			if _, err := r.Next(); !errors.Is(err, io.EOF) {
				t.Errorf("after the end: %v, want io.EOF", err)
			}
		})
	}
}

// TestReaderTake: the lines Take returns stay as they were while the
// Reader reads on, past more than its read buffer holds, short lines and
// lines longer than the buffer alike.
func TestReaderTake(t *testing.T) {
	var in strings.Builder
	var want []string
	for i := range 20000 {
		line := fmt.Sprintf("line %d", i)
		if i%5000 == 0 {
			line = strings.Repeat(line, 20000) // longer than the read buffer
		}
		in.WriteString(line + "\n")
		want = append(want, line)
	}
	r := NewReader(strings.NewReader(in.String()))
	var got [][]byte
	for {
		line, err := r.Take()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, line)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d", len(got), len(want))
	}
	for i := range got {
		if string(got[i]) != want[i] {
			t.Fatalf("line %d = %.20q, want %.20q", i+1, got[i], want[i])
		}
	}
}

// TestReaderLineTooLong: a line over the limit is a *LineTooLongError
// naming it, wherever the limit falls (in the read buffer or past it), and
// the next call returns the line after it, numbered on.
func TestReaderLineTooLong(t *testing.T) {
	big := strings.Repeat("x", 200<<10) // longer than the read buffer
	tests := []struct {
		name  string
		limit int
		in    string
		want  []string // lines, "!N" for the error of a too long line N
	}{
		{"within the buffer", 4, "abcd\nabcde\nab\n", []string{"abcd", "!2", "ab"}},
		{"past the buffer", 100 << 10, "a\n" + big + "\nb\n" + big + big + "\nc", []string{"a", "!2", "b", "!4", "c"}},
		{"the last line, without newline", 100 << 10, "a\n" + big, []string{"a", "!2"}},
		{"two in a row", 4, "abcde\n" + big + "\n\nz\n", []string{"!1", "!2", "", "z"}},
		{"at the limit", 4, "abcd\n", []string{"abcd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewReaderLimit(strings.NewReader(tt.in), tt.limit)
			var got []string
			for {
				line, err := r.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if e, ok := errors.AsType[*LineTooLongError](err); ok {
					if e.Limit != tt.limit {
						t.Errorf("line %d: limit %d, want %d", e.Line, e.Limit, tt.limit)
					}
					got = append(got, fmt.Sprintf("!%d", e.Line))
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, string(line))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %.40q, want %.40q", got, tt.want)
			}
		})
	}
}

// TestReaderMaxLineBytes: NewReader's limit is MaxLineBytes, and the error
// says so in the words `streamd publish` prints.
func TestReaderMaxLineBytes(t *testing.T) {
	r := NewReader(strings.NewReader("a\n" + strings.Repeat("x", MaxLineBytes+1) + "\nb\n"))
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err == nil || err.Error() != "stdin line 2 is longer than 16777216 bytes" {
		t.Fatalf("got %v, want line 2's line-too-long error", err)
	}
	if line, err := r.Next(); err != nil || string(line) != "b" {
		t.Errorf("after the long line: %q, %v; want line b", line, err)
	}
}

// TestReaderTooLongBounded: the Reader holds no more of a too long line
// than its limit, however long the line.
func TestReaderTooLongBounded(t *testing.T) {
	const limit, long = 1 << 10, 64 << 20
	in := io.MultiReader(io.LimitReader(xs{}, long), strings.NewReader("\nnext\n"))
	r := NewReaderLimit(in, limit)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := r.Next(); !errors.As(err, new(*LineTooLongError)) {
		t.Fatalf("got %v, want a too long line", err)
	}
	line, err := r.Next()
	runtime.ReadMemStats(&after)
	if err != nil || string(line) != "next" {
		t.Fatalf("after the long line: %q, %v; want line next", line, err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("reading past a %d-byte line allocated %d bytes", long, n)
	}
}

// xs is an endless input of 'x'.
type xs struct{}

func (xs) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestWriter(t *testing.T) {
	var b strings.Builder
	w := NewWriter(&b)
	if err := w.Write("jobs", []byte(`{"id":7}`)); err != nil {
		t.Fatal(err)
	}
	if err := w.Write("jobs", nil); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty record: %v, want ErrEmpty", err)
	}
	if err := w.Write("bad key", []byte("x")); err == nil {
		t.Error("invalid key accepted")
	}
	line := b.String()
	if !strings.HasSuffix(line, ` | jobs | 0] {"id":7}`+"\n") || strings.Count(line, "\n") != 1 {
		t.Errorf("output %q, want one producer line of key jobs, sequence 0", line)
	}
}

func TestWriterClosedOutput(t *testing.T) {
	r, wf, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer wf.Close()
	w := NewWriter(wf)
	if err := w.Write("jobs", []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write to a closed pipe: %v, want ErrClosed", err)
	}
	if err := w.Err(); !errors.Is(err, ErrClosed) {
		t.Errorf("Err() = %v after EPIPE, want ErrClosed", err)
	}
	if err := w.Write("jobs", []byte("y")); !errors.Is(err, ErrClosed) {
		t.Errorf("second write: %v, want ErrClosed", err)
	}
}

// failOnce fails its first write after writing part of it, as a write
// that fills the disk does, and takes every later one.
type failOnce struct {
	bytes.Buffer
	failed bool
}

func (f *failOnce) Write(p []byte) (int, error) {
	if !f.failed {
		f.failed = true
		n, _ := f.Buffer.Write(p[:len(p)/2])
		return n, syscall.ENOSPC
	}
	return f.Buffer.Write(p)
}

// TestWriterFailed: after a write that failed otherwise than at a closed
// pipe, having written part of its line, the writer writes nothing more
// (a line written after the torn one would be read as one with it), and
// every write says why.
func TestWriterFailed(t *testing.T) {
	out := &failOnce{}
	w := NewWriter(out)
	err := w.Write("jobs", []byte("first"))
	if !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrClosed) {
		t.Fatalf("the failed write: %v, want ErrFailed with its cause", err)
	}
	torn := out.String()
	if err := w.Write("jobs", []byte("second")); !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a write after it: %v, want the same failure", err)
	}
	if out.String() != torn {
		t.Errorf("the output after the failure: %q, want what the failed write left, %q, alone", out.String(), torn)
	}
	if err := w.Err(); !errors.Is(err, ErrFailed) {
		t.Errorf("Err() = %v, want ErrFailed", err)
	}
}
