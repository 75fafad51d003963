package streamfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/pipe"
)

// publishedPayloads returns "seq payload" for every frame of the file at
// path.
func publishedPayloads(t *testing.T, path string) []string {
	t.Helper()
	frames, _ := readFrames(t, path)
	var out []string
	for _, f := range frames {
		out = append(out, fmt.Sprintf("%d %s", f.Seq, f.Payload))
	}
	return out
}

// TestAppenderFollowsReplacedPath: once another file is renamed over the
// path, the next batch goes to it, continuing its sequence numbers, and
// what went to the old file stays there; a path that is merely gone is no
// replacement.
func TestAppenderFollowsReplacedPath(t *testing.T) {
	dir := t.TempDir()
	path, old := filepath.Join(dir, "events.ss"), filepath.Join(dir, "events.ss.1")
	a, err := OpenAppender(path, AppendOptions{Create: true, BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	publish := func(p string) {
		t.Helper()
		if err := a.Publish([]Frame{{Key: "k", TimestampMs: 1, Payload: []byte(p)}}); err != nil {
			t.Fatal(err)
		}
	}
	publish("a1")
	if err := os.Rename(path, old); err != nil {
		t.Fatal(err)
	}
	publish("a2") // the path is gone: still the open file
	other, err := OpenAppender(path, AppendOptions{Create: true, BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Publish([]Frame{{Key: "k", TimestampMs: 1, Payload: []byte("b1")}}); err != nil {
		t.Fatal(err)
	}
	other.Close()
	first := a.Writer()
	publish("a3")
	if a.Writer() == first {
		t.Error("the writer did not change with the file")
	}
	if got, want := publishedPayloads(t, old), []string{"1 a1", "2 a2"}; !slices.Equal(got, want) {
		t.Errorf("old file holds %q, want %q", got, want)
	}
	if got, want := publishedPayloads(t, path), []string{"1 b1", "2 a3"}; !slices.Equal(got, want) {
		t.Errorf("new file holds %q, want %q", got, want)
	}
}

// TestAppenderDeletedFile: a batch that finds its file deleted and no file
// at the path goes to a new file at the path with Create; without, it
// fails, writing nothing, and goes to the next file that takes the path.
func TestAppenderDeletedFile(t *testing.T) {
	for _, create := range []bool{true, false} {
		t.Run(fmt.Sprintf("create=%t", create), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.ss")
			hdr := Header{FileName: "s.ss", BeaconInterval: 1024}
			w, err := OpenWriter(path, CreateOptions{Create: true, Header: hdr})
			if err != nil {
				t.Fatal(err)
			}
			w.Close()
			a, err := OpenAppender(path, AppendOptions{Create: create, BeaconInterval: 1024})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			frame := []Frame{{Key: "k", TimestampMs: 1, Payload: []byte("x")}}
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			deleted, size := a.Writer(), a.Writer().Size()
			err = a.Publish(frame)
			if !create {
				if !errors.Is(err, ErrRemoved) || deleted.Size() != size {
					t.Fatalf("Publish = %v, and %d bytes written to the deleted file; want ErrRemoved and none", err, deleted.Size()-size)
				}
				if w, err = OpenWriter(path, CreateOptions{Create: true, Header: hdr}); err != nil {
					t.Fatal(err)
				}
				w.Close()
				err = a.Publish(frame)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := publishedPayloads(t, path); !slices.Equal(got, []string{"1 x"}) {
				t.Errorf("the file at the path holds %q, want the batch", got)
			}
		})
	}
}

// TestAppenderStaysWhenTheNewFileCannotBeOpened: a replacement that cannot
// be opened for appending fails the batch, which writes nothing anywhere;
// the Appender stays on the old file and follows once it can.
func TestAppenderStaysWhenTheNewFileCannotBeOpened(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	a, err := OpenAppender(path, AppendOptions{Create: true, BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	frame := []Frame{{Key: "k", TimestampMs: 1, Payload: []byte("x")}}
	if err := a.Publish(frame); err != nil {
		t.Fatal(err)
	}
	// A directory took the path: no file to append to.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	old, size := a.Writer(), a.Writer().Size()
	if err := a.Publish(frame); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Publish = %v, want an error naming %s", err, path)
	}
	if a.Writer() != old || old.Size() != size {
		t.Fatal("the failed batch left the old file or wrote to it")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := a.Publish(frame); err != nil {
		t.Fatal(err)
	}
	if got := publishedPayloads(t, path); !slices.Equal(got, []string{"1 x"}) {
		t.Errorf("new file holds %q, want the batch", got)
	}
}

// TestAppenderLongFileName: a file name longer than the header holds is
// cut to MaxFileNameLen bytes, at a character boundary and with a hash of
// the whole name (TestHeaderFileName), in the header of a file the
// Appender creates.
func TestAppenderLongFileName(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"s.ss", "s.ss"},
		{strings.Repeat("n", 111), strings.Repeat("n", 111)},
		{strings.Repeat("n", 120) + ".ss", strings.Repeat("n", 102) + "~8f4f9619"},
		{strings.Repeat("n", 110) + "é.ss", strings.Repeat("n", 102) + "~50e4b246"},
	} {
		t.Run(fmt.Sprint(len(tc.name)), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tc.name)
			a, err := OpenAppender(path, AppendOptions{Create: true, BeaconInterval: 1024})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if got := a.Writer().Header().FileName; got != tc.want {
				t.Errorf("header file name %q (%d bytes), want %q", got, len(got), tc.want)
			}
		})
	}
}

// TestPublishLines: lines become records of their own key or the default
// one, with the headers, in batches that end with the input at hand; a bad
// line stops it before anything of its batch is handed out.
func TestPublishLines(t *testing.T) {
	var batches [][]string
	publish := func(b []Frame) error {
		var keys []string
		for _, f := range b {
			keys = append(keys, f.Key+" "+string(f.Payload))
		}
		batches = append(batches, keys)
		return nil
	}
	n, err := PublishLines(strings.NewReader("one\n[k2] two\nthree"), LineOptions{Key: "k1"}, publish)
	if n != 3 || err != nil || fmt.Sprint(batches) != "[[k1 one k2 two k1 three]]" {
		t.Fatalf("PublishLines = %d, %v; batches %q", n, err, batches)
	}
	batches = nil
	var nk *NoKeyError
	n, err = PublishLines(strings.NewReader("[k] one\ntwo\n"), LineOptions{}, publish)
	if n != 0 || !errors.As(err, &nk) || err.Error() != "stdin line 2 has no [key]" || batches != nil {
		t.Fatalf("PublishLines = %d, %v; batches %q", n, err, batches)
	}
	failed := errors.New("no room")
	n, err = PublishLines(strings.NewReader("x\n"), LineOptions{Key: "k"}, func([]Frame) error { return failed })
	if n != 0 || !errors.Is(err, failed) {
		t.Fatalf("PublishLines = %d, %v; want the error of publish", n, err)
	}
	// Lines as long as a pipe stage takes, and no longer.
	long := strings.Repeat("x", 1<<20)
	var got []int
	n, err = PublishLines(strings.NewReader("a\n"+long+"\nb\n"), LineOptions{Key: "k"}, func(b []Frame) error {
		for _, f := range b {
			got = append(got, len(f.Payload))
		}
		return nil
	})
	if n != 3 || err != nil || fmt.Sprint(got) != fmt.Sprint([]int{1, len(long), 1}) {
		t.Fatalf("PublishLines of a 1 MiB line = %d, %v; payload sizes %v", n, err, got)
	}
	n, err = PublishLines(strings.NewReader("a\n"+strings.Repeat("x", pipe.MaxLineBytes+1)+"\n"), LineOptions{Key: "k"}, func([]Frame) error { return nil })
	if want := fmt.Sprintf("stdin line 2 is longer than %d bytes", pipe.MaxLineBytes); n != 0 || err == nil || err.Error() != want {
		t.Fatalf("PublishLines of a line over the limit = %d, %v; want %q", n, err, want)
	}
}

// TestHeaderFileName: ASCII stays, every byte of a non-ASCII character
// becomes %XX, and a name too long for the header is cut before the
// character (or byte) that does not fit whole, leaving room for "~" and
// the CRC-32 of the whole name: two long names that begin alike differ.
func TestHeaderFileName(t *testing.T) {
	long := strings.Repeat("n", MaxFileNameLen-4)
	cut := strings.Repeat("n", MaxFileNameLen-9)
	cyrillic := strings.Repeat("ж", 60) // 120 bytes, 360 encoded
	cyrillicCut := strings.Repeat("%D0%B6", 17)
	for path, want := range map[string]string{
		"/d/orders.ss":                   "orders.ss",
		"/d/café.ss":                     "caf%C3%A9.ss",
		"/d/100%.ss":                     "100%.ss",
		"/d/" + long + "abcd":            long + "abcd",
		"/d/" + long + "é":               cut + "~db665929",
		"/d/" + long + "abcde":           cut + "~da066d2a",
		"/d/" + cyrillic + "a.ss":        cyrillicCut + "~25200b69",
		"/d/" + cyrillic + "b.ss":        cyrillicCut + "~3795a487",
		"/d/" + cyrillic + "b.ss.1/x.ss": "x.ss",
	} {
		if got := headerFileName(path); got != want || len(got) > MaxFileNameLen {
			t.Errorf("headerFileName(%q) = %q, want %q", path, got, want)
		}
	}
}

// TestPublishFileFullDisk: the disk fills up in the middle of a batch, at
// each of its bytes in turn (inside a frame, at a frame's end, inside a
// beacon, after a frame that ends on a boundary). PublishFile counts the
// records the batch left whole in the file, which readers see, and no
// other; publishing the input from the line after them, once there is room,
// makes the file hold every line once, in order, with sequences 1 to N. Not
// parallel: the limit holds for the process.
func TestPublishFileFullDisk(t *testing.T) {
	if !testutil.InOwnProcess(t) {
		return
	}
	var lines []string
	for i := range 16 {
		n := 95 // frames of 128 bytes from 128: the 7th ends on the boundary at 1024
		if i >= 7 {
			n = 40 + i*37%120
		}
		lines = append(lines, fmt.Sprintf("%02d%s", i, strings.Repeat("x", n-2)))
	}
	input := func(from int) *strings.Reader { return strings.NewReader(strings.Join(lines[from:], "\n") + "\n") }
	lo, ao := LineOptions{Key: "k"}, AppendOptions{Create: true, BeaconInterval: 1024}
	var want []string
	for i, l := range lines {
		want = append(want, fmt.Sprintf("%d %s", i+1, l))
	}
	dir := t.TempDir()
	whole := filepath.Join(dir, "whole.ss")
	if n, err := PublishFile(whole, input(0), lo, ao); n != len(lines) || err != nil {
		t.Fatalf("PublishFile = %d, %v", n, err)
	}
	fi, err := os.Stat(whole)
	if err != nil {
		t.Fatal(err)
	}
	for limit := int64(HeaderSize + 1); limit < fi.Size(); limit++ {
		path := filepath.Join(dir, fmt.Sprint(limit))
		lift := testutil.LimitFileSize(t, uint64(limit))
		n, err := PublishFile(path, input(0), lo, ao)
		lift()
		if _, failed := errors.AsType[*AppendError](err); !failed {
			t.Fatalf("limit %d: PublishFile = %d, %v; want an AppendError", limit, n, err)
		}
		if frames, _ := readFramesLenient(t, path); len(frames) != n {
			t.Fatalf("limit %d: PublishFile counts %d records, readers see %d (%v)", limit, n, len(frames), err)
		}
		if rest, err := PublishFile(path, input(n), lo, ao); rest != len(lines)-n || err != nil {
			t.Fatalf("limit %d: publishing from line %d = %d, %v", limit, n+1, rest, err)
		}
		if got := publishedPayloads(t, path); !slices.Equal(got, want) {
			t.Fatalf("limit %d: after the rerun from line %d the file holds %q, want %q", limit, n+1, got, want)
		}
		checkBeacons(t, path)
		os.Remove(path)
	}
}

// TestAppenderFollowPath: FollowPath moves the Appender to the file that
// took the path, before any batch, and syncs and closes the one it left;
// with the same file at the path, or none, it stays.
func TestAppenderFollowPath(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.ss")
	a, err := OpenAppender(path, AppendOptions{Create: true, BeaconInterval: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	first := a.Writer()
	if err := a.FollowPath(); err != nil || a.Writer() != first {
		t.Fatalf("the same file at the path: %v, moved %v", err, a.Writer() != first)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := a.FollowPath(); err != nil || a.Writer() != first {
		t.Fatalf("no file at the path: %v, moved %v", err, a.Writer() != first)
	}
	w, err := OpenWriter(path, CreateOptions{Create: true, Header: Header{FileName: "s.ss", CreatedAtMs: 2, BeaconInterval: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := a.FollowPath(); err != nil || a.Writer() == first {
		t.Fatalf("another file at the path: %v, moved %v", err, a.Writer() != first)
	}
	if _, err := first.Stat(); err == nil {
		t.Error("the file left is still open")
	}
	if err := a.Publish([]Frame{{Key: "k", TimestampMs: 1, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := readFrames(t, path); len(got) != 1 {
		t.Fatalf("the file at the path holds %d frames, want the one published", len(got))
	}
}
