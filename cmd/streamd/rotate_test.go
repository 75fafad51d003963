package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/streamfile"
)

// copytruncate does what logrotate's copytruncate does to the file at path:
// copies it to path.1 and truncates it to 0 bytes.
func copytruncate(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".1", b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
}

// TestRunCopytruncate: logrotate's copytruncate while retry copies are
// pending, before the daemon wrote its first copy into the file and after
// it wrote some: the copies written after it start the file anew with a
// header, the file stays a valid stream file, and every copy is written,
// read and delivered, without a restart.
func TestRunCopytruncate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		outcome string
		before  int // attempts delivered before the truncation
		want    []string
	}{
		{"before the first copy", `if [ "$STREAMD_ATTEMPT" = 1 ]; then echo retry_after=1500ms; fi`, 3,
			[]string{"1 a", "1 b", "1 c", "2 a", "2 b", "2 c"}},
		{"after copies", `case $STREAMD_ATTEMPT in 1) echo retry_after=100ms;; 2) echo retry_after=1500ms;; esac`, 6,
			[]string{"1 a", "1 b", "1 c", "2 a", "2 b", "2 c", "3 a", "3 b", "3 c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, execSubTable("billing", "orders", "", `IFS= read -r p; echo "$STREAMD_ATTEMPT $p" >> LOG; `+tc.outcome))
			e.publish("a", "b", "c")
			p := e.start()
			eventually(t, 10*time.Second, "the deliveries before the truncation", func() bool { return len(e.deliveries()) == tc.before })
			copytruncate(t, e.stream)
			eventually(t, 10*time.Second, "every copy delivered", func() bool { return len(e.deliveries()) == len(tc.want) })
			got := e.deliveries()
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("deliveries %q, want %q", got, tc.want)
			}
			var copies []string
			for _, f := range e.framesOf("orders") { // a valid stream file: readFile verifies it
				copies = append(copies, f.header("x-ruststream-retry-count")+" "+f.payload)
			}
			if n := len(tc.want) / 3; len(copies) != 3 || !strings.HasPrefix(copies[0], string(rune('0'+n-1))+" ") {
				t.Errorf("the file holds %q, want the three copies of count %d", copies, n-1)
			}
			if code := p.stop(t); code != 0 {
				t.Errorf("exit code %d", code)
			}
		})
	}
}

// TestRunRotationLongNames: two streams in one directory whose names are
// longer than a header holds and begin alike (Cyrillic, percent-encoded in
// the header); one is rotated. Its subscription reads its own rotated file
// and the new one, never the other stream's file, whose header name must
// differ although both were cut.
func TestRunRotationLongNames(t *testing.T) {
	t.Parallel()
	e := newEnv(t, execSubTable("billing", "orders", "", `IFS= read -r p; echo "$p" >> LOG`))
	moscow := filepath.Join(e.dir, "заказы_интернет_магазина_москва.ss")
	kazan := filepath.Join(e.dir, "заказы_интернет_магазина_казань.ss")
	e.editConfig(fmt.Sprintf("path = %q", e.stream), fmt.Sprintf("path = %q", moscow),
		`poll_interval = "200ms"`, "poll_interval = \"200ms\"\nrotation_grace = \"300ms\"")
	runBinaryOK(t, "m1", "publish", "--file="+moscow, "--key=orders")
	p := e.start()
	eventually(t, 10*time.Second, "m1 delivered", func() bool { return len(e.deliveries()) == 1 })
	runBinaryOK(t, "k1", "publish", "--file="+kazan, "--key=orders")
	runBinaryOK(t, "m2", "publish", "--file="+moscow, "--key=orders")
	if err := os.Rename(moscow, moscow+".1"); err != nil {
		t.Fatal(err)
	}
	runBinaryOK(t, "m3", "publish", "--file="+moscow, "--key=orders")
	eventually(t, 10*time.Second, "m3 delivered", func() bool { return slices.Contains(e.deliveries(), "m3") })
	if code := p.stop(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if got, want := e.deliveries(), []string{"m1", "m2", "m3"}; !slices.Equal(got, want) {
		t.Errorf("deliveries %q, want %q", got, want)
	}
}

// stoppedHoldingA4 runs streamd on records a1 to a6 of subscription
// billing, whose handler fails a4 until the file flag exists, and stops it
// once a1 to a3 are committed: the stored position is at a4. Files are
// left quiet for 300 ms (rotation_grace) before they are left.
func stoppedHoldingA4(t *testing.T) (e *env, flag string, stored offsets.Position) {
	t.Helper()
	flag = filepath.Join(t.TempDir(), "answer")
	e = newEnv(t, execSubTable("billing", "orders", `backoff = ["100ms"]`,
		`IFS= read -r p; if [ "$p" = a4 ] && [ ! -e `+flag+` ]; then exit 75; fi; echo "$p" >> LOG`))
	e.editConfig(`poll_interval = "200ms"`, "poll_interval = \"200ms\"\nrotation_grace = \"300ms\"")
	e.publish("a1", "a2", "a3", "a4", "a5", "a6")
	p := e.start()
	eventually(t, 10*time.Second, "a1 to a3 committed", committedThrough(e.stateDirPath(), "billing", 3))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	return e, flag, storedPosition(t, e, "billing")
}

// TestRunRotationWhileStopped: the stream file is rotated twice (renamed
// within its directory, and a new file created at the path) while streamd
// is stopped with records of it not delivered: offsets show says that the
// rotated file's rest is read first, then the file rotated after it, and
// counts them in the lag, as streamd_stream_lag_bytes does once started
// again (the size at the path minus the position would be negative); the
// next start delivers that rest, then the records of the file in between
// and of the new file, each once.
func TestRunRotationWhileStopped(t *testing.T) {
	t.Parallel()
	e, flag, stored := stoppedHoldingA4(t)
	rotated, between := e.stream+".2", e.stream+".1"
	if err := os.Rename(e.stream, rotated); err != nil {
		t.Fatal(err)
	}
	e.publish("m1", "m2")
	if err := os.Rename(e.stream, between); err != nil {
		t.Fatal(err)
	}
	// Files are told apart by their creation time, in milliseconds.
	time.Sleep(2 * time.Millisecond)
	e.publish("b1", "b2")
	lag := fileSize(t, rotated) - stored.Offset + fileSize(t, between) + fileSize(t, e.stream) - 2*streamfile.HeaderSize
	if row := e.offsetsShowRow("billing"); len(row) < 8 || row[5] != fmt.Sprint(lag) ||
		!strings.Contains(strings.Join(row[7:], " "), "rotated to "+rotated+" since: its rest is read first, then the file rotated after it") {
		t.Errorf("offsets show: %q, want the lag %d over the three files and the rotated file named", row, lag)
	}

	// Started again, it holds a4 in the rotated file until the flag
	// exists.
	metrics := e.withMetrics()
	p := e.start()
	eventually(t, 10*time.Second, "a4 held", gaugeIs(metrics, heldSeries("billing"), 1))
	eventually(t, 10*time.Second, "the lag metric over the three files", gaugeIs(metrics, `streamd_stream_lag_bytes{stream="orders",subscription="billing"}`, float64(lag)))
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := []string{"a1", "a2", "a3", "a4", "a5", "a6", "m1", "m2", "b1", "b2"}
	eventually(t, 15*time.Second, "every record of both files delivered", func() bool { return len(e.deliveries()) >= len(want) })
	eventually(t, 10*time.Second, "the lag metric at 0", gaugeIs(metrics, `streamd_stream_lag_bytes{stream="orders",subscription="billing"}`, 0))
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.deliveries(); !slices.Equal(got, want) {
		t.Errorf("deliveries %q, want %q", got, want)
	}
	if rec := slogRecords(p.stderr.String(), "the stored position is in a file rotated away"); len(rec) != 1 || rec[0]["rotated_path"] != rotated {
		t.Errorf("the resumption in the rotated file logged %v, want once, naming %s", rec, rotated)
	}
	// The switches to the file in between and to the one at the path are
	// routine: logged at INFO; the hold is the only warning.
	lines := slices.DeleteFunc(problemLines(p.stderr.String()), func(l string) bool { return strings.Contains(l, holdMsgFirst) })
	if len(lines) != 0 {
		t.Errorf("warnings and errors after the restart:\n%s\nwant only the hold", strings.Join(lines, "\n"))
	}
	mid := slogRecords(p.stderr.String(), "stream file replaced; reading the file after it, rotated away from the path already")
	atPath := slogRecords(p.stderr.String(), "stream file replaced; reading the file now at the path")
	if len(mid) != 1 || len(atPath) != 1 {
		t.Errorf("the switches logged %v to the file rotated away and %v to the one at the path, want one each", mid, atPath)
	}

}

// TestRunCopytruncateWhileStopped: logrotate's copytruncate (the file
// copied, then truncated in place, and written anew) while streamd is
// stopped with records of it not delivered: offsets show names the copy,
// whose rest is read first, and counts it in the lag; the next start
// delivers that rest from the copy, then the new records, each once, and
// logs no loss.
func TestRunCopytruncateWhileStopped(t *testing.T) {
	t.Parallel()
	e, flag, stored := stoppedHoldingA4(t)
	copied := e.stream + ".1"
	b, err := os.ReadFile(e.stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copied, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(e.stream, 0); err != nil {
		t.Fatal(err)
	}
	e.publish("b1", "b2")
	lag := fileSize(t, copied) - stored.Offset + fileSize(t, e.stream) - streamfile.HeaderSize
	if row := e.offsetsShowRow("billing"); len(row) < 8 || row[5] != fmt.Sprint(lag) ||
		!strings.Contains(strings.Join(row[7:], " "), "copied to "+copied+" and truncated since (copytruncate): the copy's rest is read first, then the file at the path") {
		t.Errorf("offsets show: %q, want the lag %d over the copy and the file, and the copy named", row, lag)
	}

	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.start()
	want := []string{"a1", "a2", "a3", "a4", "a5", "a6", "b1", "b2"}
	eventually(t, 15*time.Second, "every record of the copy and the file delivered", func() bool { return len(e.deliveries()) >= len(want) })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := e.deliveries(); !slices.Equal(got, want) {
		t.Errorf("deliveries %q, want %q", got, want)
	}
	if rec := slogRecords(p.stderr.String(), "the file of the stored position was truncated in place after a copy"); len(rec) != 1 || rec[0]["copy_path"] != copied {
		t.Errorf("the resumption in the copy logged %v, want once, naming %s", rec, copied)
	}
	// The switch back to the file at the path is routine: no warning.
	if lines := problemLines(p.stderr.String()); len(lines) != 0 {
		t.Errorf("warnings and errors after the restart:\n%s\nwant none", strings.Join(lines, "\n"))
	}
}

// TestRunRotationKeepsOldFileWriter: the stream file is rotated (renamed
// away, or a symlink at the path retargeted) while a producer that keeps
// its descriptor, as the upstream writer does under logrotate's create,
// writes to the old file for 2 s after the switch: every record of both
// files is delivered, the old file's after the switch too.
func TestRunRotationKeepsOldFileWriter(t *testing.T) {
	t.Parallel()
	for _, symlink := range []bool{false, true} {
		name := "mv"
		if symlink {
			name = "symlink"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, execSubTable("billing", "orders", "", `IFS= read -r p; echo "$p" >> LOG`))
			target := e.stream
			if symlink {
				target = filepath.Join(e.dir, "a.ss")
				if err := os.Symlink("a.ss", e.stream); err != nil {
					t.Fatal(err)
				}
			}
			runBinaryOK(t, "old-0", "publish", "--file="+target, "--key=orders", "--beacon-interval=1024")
			p := e.start()
			eventually(t, 10*time.Second, "old-0 delivered", func() bool { return len(e.deliveries()) == 1 })

			producer, err := streamfile.OpenWriter(target, streamfile.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer producer.Close()
			if symlink {
				next := filepath.Join(e.dir, "b.ss")
				runBinaryOK(t, "new-0\nnew-1", "publish", "--file="+next, "--key=orders", "--beacon-interval=1024")
				tmp := filepath.Join(e.dir, "link.tmp")
				if err := errors.Join(os.Symlink("b.ss", tmp), os.Rename(tmp, e.stream)); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := os.Rename(e.stream, e.stream+".1"); err != nil {
					t.Fatal(err)
				}
				e.publish("new-0", "new-1")
			}
			want := []string{"new-0", "new-1", "old-0"}
			for i := range 10 {
				time.Sleep(200 * time.Millisecond) // the producer's pace: records 2 s long after the switch
				payload := fmt.Sprintf("old-%02d", i+1)
				if err := producer.Publish([]streamfile.Frame{{Key: "orders", TimestampMs: uint64(time.Now().UnixMilli()), Payload: []byte(payload)}}); err != nil {
					t.Fatal(err)
				}
				want = append(want, payload)
			}
			slices.Sort(want)
			eventually(t, 15*time.Second, "every record of both files delivered", func() bool { return len(e.deliveries()) >= len(want) })
			got := e.deliveries()
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("deliveries %q, want %q", got, want)
			}
			// The follower logs the switch once the old file's grace has
			// passed, which may be after its last record was delivered.
			switchLine := regexp.MustCompile(`old_records_after_switch=(\d+)`)
			eventually(t, 15*time.Second, "the switch's log line", func() bool { return switchLine.MatchString(p.stderr.String()) })
			n := -1
			if m := switchLine.FindStringSubmatch(p.stderr.String()); m != nil {
				n, _ = strconv.Atoi(m[1])
			}
			if n < 5 {
				t.Errorf("the switch's log line counts %d records read from the old file after the switch, want the producer's (10, or a few less read before the switch was noticed)", n)
			}
			if code := p.stop(t); code != 0 {
				t.Errorf("exit code %d", code)
			}
		})
	}
}

// TestRunCopyToDeletedFile: a dead letter made while the stream file is
// deleted goes to the file at the path, never to the deleted one, where
// no reader would find it: to a new file the daemon creates (create =
// true), or to the next file a producer creates (create = false), the
// record held until then.
func TestRunCopyToDeletedFile(t *testing.T) {
	t.Parallel()
	for _, create := range []bool{true, false} {
		t.Run(fmt.Sprintf("create=%t", create), func(t *testing.T) {
			t.Parallel()
			// The handler logs that it has the victim, waits for the
			// test to delete the file, and gives up on it; it acks the
			// others.
			e := newEnv(t, execSubTable("billing", "orders", "max_attempts = 1\ndead_letter = \"orders.dead\"\nbackoff = [\"100ms\"]",
				`IFS= read -r p; [ "$p" = victim ] || exit 0; echo "$p" >> LOG; while [ ! -e LOG.go ]; do sleep 0.02; done; echo outcome=retry`))
			if !create {
				e.editConfig(`beacon_interval = 1024`, "beacon_interval = 1024\ncreate = false")
			}
			publishTo(t, e.stream, "victim")
			p := e.start()
			eventually(t, 10*time.Second, "the handler to have the record", func() bool { return len(e.deliveries()) == 1 })
			if err := os.Remove(e.stream); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(e.log+".go", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if !create {
				eventually(t, 10*time.Second, "the copy to fail", func() bool {
					return strings.Contains(p.stderr.String(), "was deleted, and no file is at its path")
				})
				publishTo(t, e.stream, "after")
			}
			eventually(t, 10*time.Second, "the dead letter in the file at the path", func() bool {
				return slices.ContainsFunc(scanFrames(e.stream), func(r streamfile.Record) bool { return r.Key == "orders.dead" })
			})
			if code := p.stop(t); code != 0 {
				t.Fatalf("daemon exit %d", code)
			}
			dead := e.framesOf("orders.dead")
			if len(dead) != 1 || dead[0].payload != "victim" {
				t.Errorf("dead letters in the file at the path: %+v, want victim once", dead)
			}
		})
	}
}
