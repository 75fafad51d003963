package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// readFile decodes every frame of the stream file at path and verifies its
// beacons.
func readFile(t testing.TB, path string) []streamfile.Frame {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	rep, err := streamfile.Verify(f, fi.Size())
	if err != nil {
		t.Fatal(err)
	}
	if rep.End != fi.Size() {
		t.Fatalf("%s: %d bytes after the last complete frame", path, fi.Size()-rep.End)
	}
	h, _ := streamfile.ReadHeader(f)
	d := streamfile.NewDecoder(f, h, streamfile.HeaderSize)
	var frames []streamfile.Frame
	for {
		r, err := d.Next()
		if err != nil {
			return frames
		}
		fr := r.Frame
		fr.Payload = bytes.Clone(r.Payload)
		frames = append(frames, fr)
	}
}

// framesAt returns the frames of one key in the stream file at path.
func framesAt(t testing.TB, path, key string) []streamfile.Frame {
	t.Helper()
	var out []streamfile.Frame
	for _, f := range readFile(t, path) {
		if f.Key == key {
			out = append(out, f)
		}
	}
	return out
}

// TestPublishSeveralKeys publishes lines for several keys into a file with a
// 1024-byte interval: every record decodes, sequences count per key from 1,
// and the beacons are exactly those of a single writer (the file equals one
// writer's output for the same frames). A second publish continues it.
func TestPublishSeveralKeys(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "multi.ss")
	var in bytes.Buffer
	keys := []string{"orders", "audit", "Zed", ""}
	for i := range 3000 {
		if k := keys[i%len(keys)]; k != "" {
			fmt.Fprintf(&in, "[%s] {\"n\":%d}\n", k, i)
		} else {
			fmt.Fprintf(&in, "default payload %d\n", i)
		}
	}
	r := runBinary(t, in.Bytes(), "publish", "--file="+path, "--key=fallback", "--beacon-interval=1024", "--header=tenant=acme")
	if r.code != 0 {
		t.Fatalf("publish: exit %d: %s", r.code, r.stderr)
	}
	frames := readFile(t, path)
	if len(frames) != 3000 {
		t.Fatalf("%d frames, want 3000", len(frames))
	}
	seq := map[string]uint64{}
	for i, f := range frames {
		want := keys[i%len(keys)]
		if want == "" {
			want = "fallback"
		}
		seq[want]++
		h, p := envelope.Decode(f.Payload)
		if tenant, _ := h.Get("tenant"); f.Key != want || f.Seq != seq[want] || string(tenant) != "acme" || !strings.Contains(string(p), fmt.Sprint(i)) {
			t.Fatalf("frame %d: key %q seq %d headers %v payload %q", i, f.Key, f.Seq, h, p)
		}
	}

	// One writer writing the same frames from scratch produces the same bytes.
	got, _ := os.ReadFile(path)
	f, _ := os.Open(path)
	hdr, _ := streamfile.ReadHeader(f)
	f.Close()
	again := filepath.Join(t.TempDir(), "again.ss")
	w, err := streamfile.OpenWriter(again, streamfile.CreateOptions{Create: true, Header: hdr})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(frames...); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if want, _ := os.ReadFile(again); !bytes.Equal(got, want) {
		t.Fatal("published file differs from a single writer's output for the same frames")
	}

	r = runBinary(t, []byte("[orders] later\n[new.key] first\n"), "publish", "--file="+path)
	if r.code != 0 {
		t.Fatalf("second publish: exit %d: %s", r.code, r.stderr)
	}
	frames = readFile(t, path)
	if n := len(frames); n != 3002 || frames[n-2].Key != "orders" || frames[n-2].Seq != seq["orders"]+1 || frames[n-1].Seq != 1 {
		t.Fatalf("after the second publish: %d frames, last two %+v %+v", n, frames[n-2], frames[n-1])
	}
}

// TestPublishConcurrent runs two publish processes appending 10 000 records
// each to one file at the same time.
func TestPublishConcurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.ss")
	bin := streamdBinary(t)
	const n = 10000
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for p := range 2 {
		wg.Go(func() {
			var in bytes.Buffer
			for i := range n {
				fmt.Fprintf(&in, "p%d-%d\n", p, i)
			}
			cmd := exec.Command(bin, "publish", "--file="+path, "--key=shared", "--beacon-interval=1024")
			// Feed stdin in small writes so the two processes interleave batches.
			cmd.Stdin = &slowReader{b: in.Bytes(), chunk: 4096}
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs[p] = fmt.Errorf("publish %d: %v: %s", p, err, out)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	frames := readFile(t, path)
	if len(frames) != 2*n {
		t.Fatalf("%d frames, want %d", len(frames), 2*n)
	}
	next := [2]int{}
	interleaved := false
	for i, f := range frames {
		if f.Seq != uint64(i+1) {
			t.Fatalf("frame %d has seq %d, want %d", i, f.Seq, i+1)
		}
		var p, k int
		fmt.Sscanf(string(f.Payload), "p%d-%d", &p, &k)
		if k != next[p] {
			t.Fatalf("frame %d: %q, want p%d-%d", i, f.Payload, p, next[p])
		}
		next[p]++
		interleaved = interleaved || (i > 0 && !bytes.Equal(f.Payload[:2], frames[i-1].Payload[:2]))
	}
	if !interleaved {
		t.Log("the two publishers did not interleave; the test still checked the file")
	}
}

// slowReader hands out b in chunks, one per Read.
type slowReader struct {
	b     []byte
	chunk int
}

func (s *slowReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), s.chunk)], s.b)
	s.b = s.b[n:]
	return n, nil
}

func TestPublishBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notSS, v2 := badStreamFiles(t, dir)
	fresh := filepath.Join(dir, "fresh.ss")
	for _, tc := range []struct {
		name  string
		file  string
		args  []string
		stdin string
		code  int
		want  string
	}{
		{"wrong magic", notSS, []string{"--key=k"}, "x\n", exitError, "not a stream file: magic bytes are 0x78 0x78"},
		{"wrong version", v2, []string{"--key=k"}, "x\n", exitError, "unsupported format version 2, want 1"},
		{"long key", fresh, []string{"--key=" + strings.Repeat("k", 250)}, "x\n", exitUsage, "--key: stream key is 250 bytes long, the limit is 249"},
		{"bad key character", fresh, []string{"--key=a/b"}, "x\n", exitUsage, "--key: stream key \"a/b\" has character '/' at byte 1"},
		{"header without =", fresh, []string{"--key=k", "--header=tenant"}, "x\n", exitUsage, `header "tenant" has no '=': write name=value`},
		{"bad interval", fresh, []string{"--key=k", "--beacon-interval=1000"}, "x\n", exitUsage, "invalid beacon interval 1000"},
		{"bad line key", fresh, nil, "[a b] x\n", exitError, "stdin line 1: invalid header part \"a b\""},
		{"no key", fresh, nil, "x\n", exitError, "stdin line 1 has no [key] and --key is not set"},
		{"invalid UTF-8", fresh, []string{"--key=k"}, "ok\n\xff\n", exitError, "stdin line 2: line is not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before, _ := os.ReadFile(tc.file)
			r := runBinary(t, []byte(tc.stdin), append([]string{"publish", "--file=" + tc.file}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
			after, err := os.ReadFile(tc.file)
			if tc.file == fresh {
				if !os.IsNotExist(err) {
					t.Fatalf("%s was created", tc.file)
				}
			} else if !bytes.Equal(before, after) {
				t.Fatal("file changed")
			}
		})
	}
}

// TestPublishFollowsReplacedFile: a long-running publish whose file is
// rotated (renamed away, another file created at the path) writes its next
// records to the file at the path, continuing its sequence numbers, and
// leaves what it wrote before in the old file.
func TestPublishFollowsReplacedFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, old := filepath.Join(dir, "events.ss"), filepath.Join(dir, "events.ss.1")
	bin := streamdBinary(t)
	cmd := exec.Command(bin, "publish", "--file="+path, "--key=events")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "a1\na2\n")
	eventually(t, 10*time.Second, "a1 and a2 in the file", func() bool { return countFrames(path) == 2 })

	if err := os.Rename(path, old); err != nil {
		t.Fatal(err)
	}
	runBinaryOK(t, "b1", "publish", "--file="+path, "--key=events")
	io.WriteString(stdin, "a3\na4\n")
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("publish: %v\n%s", err, stderr.String())
	}

	for _, f := range []struct {
		path string
		want []string
	}{
		{old, []string{"1 a1", "2 a2"}},
		{path, []string{"1 b1", "2 a3", "3 a4"}},
	} {
		var got []string
		for _, fr := range framesAt(t, f.path, "events") {
			got = append(got, fmt.Sprintf("%d %s", fr.Seq, fr.Payload))
		}
		if !slices.Equal(got, f.want) {
			t.Errorf("%s holds %q, want %q", filepath.Base(f.path), got, f.want)
		}
	}
}

// countFrames counts the frames the stream file at path holds so far, 0 if
// it cannot be read yet.
func countFrames(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		return 0
	}
	d := streamfile.NewDecoder(f, h, streamfile.HeaderSize)
	n := 0
	for _, err := d.Next(); err == nil; _, err = d.Next() {
		n++
	}
	return n
}

// TestPublishLongFileName: publish accepts a file name longer than the
// header holds (123 bytes, the limit is 111), as the daemon does: the
// header of the file it creates holds its first 102 bytes, "~" and a hash
// of the whole.
func TestPublishLongFileName(t *testing.T) {
	name := strings.Repeat("n", 120) + ".ss"
	path := filepath.Join(t.TempDir(), name)
	runBinaryOK(t, "x", "publish", "--file="+path, "--key=k")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if h, err := streamfile.ReadHeader(f); err != nil || h.FileName != name[:102]+"~8f4f9619" {
		t.Errorf("header file name %q, %v; want the first 102 bytes of %q and its hash", h.FileName, err, name)
	}
	if frames := framesAt(t, path, "k"); len(frames) != 1 || string(frames[0].Payload) != "x" {
		t.Errorf("frames %+v, want the one published", frames)
	}
}

// TestPublishFullDisk: a publish whose write fails in the middle of a batch
// (the disk is full in the middle of the 4th record) names the first line it
// did not publish, after the 3 records readers see; a rerun from that line
// makes the file hold every line once, in order. In-process and not
// parallel: the file size limit that fills the disk holds for the process.
func TestPublishFullDisk(t *testing.T) {
	if !testutil.InOwnProcess(t) {
		return
	}
	path := filepath.Join(t.TempDir(), "full.ss")
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf("line %02d %s", i+1, strings.Repeat("x", 90))) // 131-byte frames
	}
	publish := func(from int) (int, string) {
		var out, errb bytes.Buffer
		in := strings.NewReader(strings.Join(lines[from:], "\n") + "\n")
		code := run([]string{"publish", "--file=" + path, "--key=k", "--beacon-interval=1024"}, stdio{in, &out, &errb})
		return code, errb.String()
	}

	lift := testutil.LimitFileSize(t, streamfile.HeaderSize+3*131+50)
	code, stderr := publish(0)
	lift()
	want := "file too large; an incomplete record it may have left at the end of the file is a torn tail, which readers wait at and the next append removes " +
		"(stdin lines published: 3; rerun from line 4, e.g. with tail -n +4)"
	if code != exitError || !strings.Contains(stderr, want) {
		t.Fatalf("publish on a full disk: exit %d, stderr %q; want exit %d and %q", code, stderr, exitError, want)
	}
	if n := countFrames(path); n != 3 {
		t.Fatalf("readers see %d records, publish said 3", n)
	}

	if code, stderr := publish(3); code != exitOK {
		t.Fatalf("rerun from line 4: exit %d: %s", code, stderr)
	}
	var got []string
	for _, f := range framesAt(t, path, "k") {
		got = append(got, fmt.Sprintf("%d %s", f.Seq, f.Payload))
	}
	var all []string
	for i, l := range lines {
		all = append(all, fmt.Sprintf("%d %s", i+1, l))
	}
	if !slices.Equal(got, all) {
		t.Errorf("after the rerun the file holds %q, want %q", got, all)
	}
}

// TestPublishFileMode: --file-mode sets the bits of a file publish creates
// whatever the umask (the shared-directory recipe: 0660), leaves those of
// an existing file alone, and is refused when it is no octal mode that
// lets the owner read and write.
func TestPublishFileMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "shared.ss")
	runBinaryOK(t, "a", "publish", "--file="+path, "--key=k", "--file-mode=0660")
	mode := func() fs.FileMode {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	if m := mode(); m != 0o660 {
		t.Errorf("created with mode %04o, want 0660 (whatever the umask)", m)
	}
	runBinaryOK(t, "b", "publish", "--file="+path, "--key=k", "--file-mode=0600")
	if m := mode(); m != 0o660 {
		t.Errorf("an existing file's mode became %04o, want 0660 left alone", m)
	}
	for _, bad := range []string{"rw", "0440", "01777"} {
		r := runBinary(t, []byte("c\n"), "publish", "--file="+filepath.Join(dir, "other.ss"), "--key=k", "--file-mode="+bad)
		if r.code != exitUsage || !strings.Contains(r.stderr, "file mode") {
			t.Errorf("--file-mode=%s: exit %d, stderr %q; want exit 2 naming the file mode", bad, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "other.ss")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused --file-mode created the file: %v", err)
	}
}
