package tail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

func TestParseStart(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "beginning", want: "beginning"},
		{in: "end", want: "end"},
		{in: "seq:0", want: "seq:0"},
		{in: "seq:18446744073709551615", want: "seq:18446744073709551615"},
		{in: "time:2025-03-01T12:00:00Z", want: "time:2025-03-01T12:00:00Z"},
		{in: "time:2025-03-01T13:00:00.5+01:00", want: "time:2025-03-01T12:00:00.5Z"},
		{in: "offset:128", want: "offset:128"},
		{in: "offset:4096", want: "offset:4096"},
		{in: "", err: `start position "": want beginning, end, seq:N, time:RFC3339 or offset:N`},
		{in: "BEGINNING", want: "beginning"},
		{in: "End", want: "end"},
		{in: "SEQ:5", want: "seq:5"},
		{in: "Time:2025-03-01T12:00:00Z", want: "time:2025-03-01T12:00:00Z"},
		{in: "OFFSET:9000", want: "offset:9000"},
		{in: "Seq:x", err: `start position "Seq:x": the sequence number must be a decimal integer`},
		{in: "latest", err: `want beginning, end, seq:N, time:RFC3339 or offset:N`},
		{in: "seq:", err: `start position "seq:": the sequence number must be a decimal integer`},
		{in: "seq:-1", err: `the sequence number must be a decimal integer`},
		{in: "seq:18446744073709551616", err: `the sequence number must be a decimal integer`},
		{in: "time:yesterday", err: `start position "time:yesterday": the time must be RFC 3339`},
		{in: "time:2025-03-01", err: `the time must be RFC 3339`},
		{in: "time:1969-12-31T23:59:59Z", err: `the time is before 1970-01-01T00:00:00Z`},
		{in: "offset:127", err: `start position "offset:127": the offset must be a decimal byte offset of at least 128`},
		{in: "offset:x", err: `the offset must be a decimal byte offset`},
	} {
		s, err := ParseStart(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseStart(%q): %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || s.String() != tc.want {
			t.Errorf("ParseStart(%q) = %s, %v; want %s", tc.in, s, err, tc.want)
			continue
		}
		if again, err := ParseStart(s.String()); err != nil || again != s && again.String() != s.String() {
			t.Errorf("ParseStart(%q) does not round-trip: %s, %v", s, again, err)
		}
	}
}

// TestStartPositions starts live and replaying followers at every kind of
// start position in edge-a-spliced.ss.
func TestStartPositions(t *testing.T) {
	edgeA, offs := vectorFrames(t, "edge-a-spliced")
	path := filepath.Join(vectorDir, "edge-a-spliced.ss")
	at := func(off int64) int {
		for i, o := range offs {
			if o == off {
				return i
			}
		}
		t.Fatalf("no frame at %d", off)
		return 0
	}
	for _, tc := range []struct {
		start, key string
		first      int // index of the first record; len(edgeA) for none
		err        string
	}{
		{start: "beginning", first: 0},
		{start: "end", first: len(edgeA)},
		{start: "seq:1", key: "alpha", first: 0},
		{start: "seq:3", key: "alpha", first: at(1007)},
		{start: "seq:4", key: "alpha", first: at(4408)},
		{start: "seq:2", key: "Zed", first: at(4900)},
		{start: "seq:9", key: "alpha", first: len(edgeA)},
		{start: "time:" + time.UnixMilli(int64(edgeA[at(1007)].TimestampMs)).UTC().Format(time.RFC3339Nano), key: edgeA[at(1007)].Key, first: at(4408)},
		{start: "offset:128", first: 0},
		{start: "offset:2087", first: at(2087)},   // after the beacon at 2048
		{start: "offset:2048", first: at(2087)},   // the end of the frame before that beacon
		{start: "offset:6786", first: len(edgeA)}, // the end of the data
		{start: "offset:4408", first: at(4408)},   // after a frame spliced by two beacons
		{start: "offset:1010", err: "offset 1010 is not a frame boundary: it lies inside the frame at 1007, which ends at 1125"},
		{start: "offset:2050", err: "offset 2050 is not a frame boundary: it lies in the beacon between the frames ending at 2048 and starting at 2087"},
		{start: "offset:3072", err: "offset 3072 is not a frame boundary: it lies inside the frame at 2087, which ends at 4408"},
		{start: "offset:6787", err: "offset 6787 is past the end of the file (6786 bytes)"},
	} {
		t.Run(tc.start+"/"+tc.key, func(t *testing.T) {
			start, err := ParseStart(tc.start)
			if err != nil {
				t.Fatal(err)
			}
			fl, err := New(Options{Path: path, Key: tc.key, Start: start, Replay: true})
			if tc.err != "" {
				want := "tail: " + mustAbs(t, path) + ": start position " + tc.start + ": " + tc.err
				if err == nil || err.Error() != want {
					t.Fatalf("got %v\nwant %s", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			var gotten []got
			for {
				r, err := fl.Next(context.Background())
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				gotten = append(gotten, copyRecord(r))
			}
			if err := sameFrames(gotten, edgeA[tc.first:]); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// TestSeekNotYetWritten starts live at a sequence that is not in the file
// yet: frames before the first one that reaches it are passed over, which
// the log says at start, and when one reaches it.
func TestSeekNotYetWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	fs := frames("k", 1, 30, 1, 50)
	other := frames("other", 100, 5, 1, 50)
	writeFile(t, path, streamfile.Header{FileName: "s.ss", CreatedAtMs: 1, BeaconInterval: 1024}, fs[:10])
	start, _ := ParseStart("seq:20")
	var log testutil.SyncBuffer
	fl, err := New(Options{Path: path, Key: "k", Start: start, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	appendFrames(t, path, append(other, fs[10:]...))
	gotten := collect(t, items, 11, 10*time.Second)
	if err := sameFrames(gotten, fs[19:]); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`level=WARN msg="` + msgStartNotReached + `" component=tail path=` + path + ` start_at=seq:20 key=k`, `level=INFO msg="` + msgStartReached + `"`, `seq=20`} {
		if strings.Count(log.String(), want) != 1 {
			t.Errorf("want one %q in the log:\n%s", want, log.String())
		}
	}
}

func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	notSS := filepath.Join(dir, "x.ss")
	writeFile(t, notSS, streamfile.Header{FileName: "x", BeaconInterval: 1024}, nil)
	cut := filepath.Join(dir, "cut.ss")
	if err := os.WriteFile(cut, readVector(t, "edge-a-spliced")[:50], 0o644); err != nil {
		t.Fatal(err)
	}
	seq, _ := ParseStart("seq:1")
	for _, tc := range []struct {
		name string
		opts Options
		err  string
	}{
		{"no path", Options{}, "tail: no path to follow"},
		{"missing", Options{Path: filepath.Join(dir, "missing.ss")}, "tail: open " + filepath.Join(dir, "missing.ss") + ": no such file or directory"},
		{"seq without key", Options{Path: notSS, Start: seq}, "tail: start position seq:1 needs a stream key"},
		{"bad key", Options{Path: notSS, Key: "a/b"}, `tail: stream key "a/b" has character '/' at byte 1`},
		{"negative poll", Options{Path: notSS, PollInterval: -1}, "tail: poll interval -1ns is negative"},
		{"not a stream file", Options{Path: filepath.Join(vectorDir, "README.md")}, "not a stream file"},
		{"header cut in replay", Options{Path: cut, Replay: true}, "cut.ss: file of 50 bytes ends inside the 128-byte header: streamfile: truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fl, err := New(tc.opts)
			if err == nil {
				fl.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("got %v, want %q", err, tc.err)
			}
		})
	}
}

// TestStartEndOfEndedStream starts at the end of files that end with an
// end-of-stream frame (in edge-d spliced by a beacon): the follow begins at
// that frame and ends there.
func TestStartEndOfEndedStream(t *testing.T) {
	end, _ := ParseStart("end")
	for _, name := range []string{"sample-1", "consumer", "edge-d-eos"} {
		t.Run(name, func(t *testing.T) {
			fl, err := New(Options{Path: filepath.Join(vectorDir, name+".ss"), Start: end, Replay: true})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			r, err := fl.Next(context.Background())
			if err != nil || !r.IsEOS() {
				t.Fatalf("got %v, %v; want the end-of-stream frame", r, err)
			}
			if _, err := fl.Next(context.Background()); !errors.Is(err, io.EOF) {
				t.Fatalf("got %v after the end of stream, want io.EOF", err)
			}
		})
	}
}

// TestOffsetAfterEndOfStream: an offset right after a file's end-of-stream
// frame (in edge-d spliced by a beacon) is refused with the frame's own
// offset, where end starts: a writer that continues the file overwrites
// the frame, and the offset would then lie inside a frame.
func TestOffsetAfterEndOfStream(t *testing.T) {
	for _, tc := range []struct {
		name      string
		eos, size int64
	}{
		{"sample-1", -1, -1},
		{"consumer", 4774, 4830},
		{"edge-d-eos", 4076, 4251},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Open(filepath.Join(vectorDir, tc.name+".ss"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h, size, _, err := streamfile.Identify(f)
			if err != nil {
				t.Fatal(err)
			}
			end, _ := ParseStart("end")
			eos, err := end.Offset(f, h, size, "")
			if err != nil || tc.eos >= 0 && (eos != tc.eos || size != tc.size) {
				t.Fatalf("end: %d, %v in %d bytes; want %d in %d", eos, err, size, tc.eos, tc.size)
			}
			if off, err := mustStart(t, fmt.Sprintf("offset:%d", eos)).Offset(f, h, size, ""); err != nil || off != eos {
				t.Errorf("offset:%d = %d, %v; want it as it is", eos, off, err)
			}
			want := fmt.Sprintf("offset %d is right after the end-of-stream frame at %d, which a writer that continues the file overwrites, leaving offset %d inside a frame: use offset:%d, where end starts", size, eos, size, eos)
			if _, err := mustStart(t, fmt.Sprintf("offset:%d", size)).Offset(f, h, size, ""); err == nil || err.Error() != want {
				t.Errorf("offset:%d: %v\nwant %s", size, err, want)
			}
		})
	}
}

func mustStart(t *testing.T, s string) Start {
	t.Helper()
	start, err := ParseStart(s)
	if err != nil {
		t.Fatal(err)
	}
	return start
}

// TestSeekNotReachedReplay: a replay started at a sequence no record of
// the file reaches says that it ends without delivering any.
func TestSeekNotReachedReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.ss")
	writeFile(t, path, streamfile.Header{FileName: "s.ss", CreatedAtMs: 1, BeaconInterval: 1024}, frames("k", 1, 10, 1, 50))
	start, _ := ParseStart("seq:20")
	var log testutil.SyncBuffer
	fl, err := New(Options{Path: path, Key: "k", Start: start, Replay: true, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if rec, err := fl.Next(t.Context()); !errors.Is(err, io.EOF) {
		t.Fatalf("Next = %v, %v; want io.EOF", rec, err)
	}
	if !strings.Contains(log.String(), msgStartNotReachedReplay) || strings.Contains(log.String(), msgStartNotReached+`"`) {
		t.Errorf("want %q, and not the live follower's line, in the log:\n%s", msgStartNotReachedReplay, log.String())
	}
}
