package pipe

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

func TestReader(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // longer than the read buffer
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty input", "", nil},
		{"lines", "a\nb\n", []string{"a", "b"}},
		{"last line without newline", "a\nb", []string{"a", "b"}},
		{"empty lines", "\n\na\n", []string{"", "", "a"}},
		{"carriage return kept", "a\r\n", []string{"a\r"}},
		{"line longer than the buffer", long + "\nz\n", []string{long, "z"}},
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

func TestReaderLineTooLong(t *testing.T) {
	r := NewReader(strings.NewReader("a\n" + strings.Repeat("x", MaxLineBytes+1) + "\n"))
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err == nil || err.Error() != "stdin line 2 is longer than 16777216 bytes" {
		t.Fatalf("got %v, want line 2's line-too-long error", err)
	}
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
	if !w.Closed() {
		t.Error("Closed() = false after EPIPE")
	}
	if err := w.Write("jobs", []byte("y")); !errors.Is(err, ErrClosed) {
		t.Errorf("second write: %v, want ErrClosed", err)
	}
}
