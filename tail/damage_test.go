package tail

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/ratelog"
	"github.com/streamd/streamd/internal/testutil"
	"github.com/streamd/streamd/streamfile"
)

// damagedFile writes 12 frames of key "k" (payloads 40 to 80 bytes, one
// beacon interval of 64 KiB, so no beacon among them), damages the frame
// at index lost with damage, and returns the file's path, the frames and
// the damaged frame's offset.
func damagedFile(t *testing.T, lost int, damage func(b []byte, off int64)) (string, []streamfile.Frame, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "d.ss")
	fs := frames("k", 1, 12, 1, 40)
	writeFile(t, path, streamfile.Header{FileName: "d.ss", CreatedAtMs: 1, BeaconInterval: 64 << 10}, fs)
	return path, fs, damageFrame(t, path, fs, lost, damage)
}

// damageFrame damages frame i of fs, the frames of the file at path
// (damagedFile), and returns its offset.
func damageFrame(t *testing.T, path string, fs []streamfile.Frame, i int, damage func(b []byte, off int64)) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(streamfile.HeaderSize)
	for _, f := range fs[:i] {
		off += int64(len(f.Key)) + 32 + int64(len(f.Payload))
	}
	damage(b, off)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return off
}

// damageSize makes the size field of the frame at off (key "k") run past
// the end of the file: it reads like a torn frame.
func damageSize(b []byte, off int64) { binary.BigEndian.PutUint32(b[off+27:], uint32(len(b))) }

// damagePayload makes the checksum of the frame at off (key "k") fail.
func damagePayload(b []byte, off int64) { b[off+30] ^= 0xFF }

// damageKey makes the frame at off unreadable: its key length byte points
// into the fields.
func damageKey(b []byte, off int64) { b[off] = 9 }

// TestDamageBeforeTheNextBeacon: a frame that cannot be read, or whose size
// runs past the end of the file, in a file that ends before its next
// beacon. The follower must not wait for that beacon (a writer refuses a
// damaged file, so it may never come): it goes on at the next whole frame,
// live (the damaged size found a poll later) and in a replay, and counts
// one format error.
func TestDamageBeforeTheNextBeacon(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func([]byte, int64)
	}{{"size", damageSize}, {"key", damageKey}} {
		for _, replay := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/replay=%v", tc.name, replay), func(t *testing.T) {
				const lost = 5
				path, fs, _ := damagedFile(t, lost, tc.damage)
				obs := newObserver()
				fl, err := New(Options{Path: path, Replay: replay, PollInterval: 20 * time.Millisecond, RotationGrace: 100 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				defer fl.Close()
				want := slices.Concat(fs[:lost], fs[lost+1:])
				var gotten []got
				if replay {
					for {
						r, err := fl.Next(t.Context())
						if errors.Is(err, io.EOF) {
							break
						}
						if err != nil {
							t.Fatalf("after %d records: %v", len(gotten), err)
						}
						gotten = append(gotten, copyRecord(r))
					}
				} else {
					items, stop := follow(t, fl)
					gotten = collect(t, items, len(want), 10*time.Second)
					stop()
				}
				if err := sameFrames(gotten, want); err != nil {
					t.Fatal(err)
				}
				if obs.count(EventFormat) != 1 {
					t.Fatalf("observer: %v, want one format error", obs)
				}
			})
		}
	}
}

// TestDamageRepaired: while a live follower waits past damaged bytes for a
// frame to read on at, the file is cut at the damage (streamd repair) and
// appended to: it reads the new frames from there.
func TestDamageRepaired(t *testing.T) {
	const lost = 11 // the last frame: nothing whole follows it
	path, fs, off := damagedFile(t, lost, damageKey)
	obs := newObserver()
	fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	items, stop := follow(t, fl)
	defer stop()
	gotten := collect(t, items, lost, 10*time.Second)
	waitFor(t, 10*time.Second, "the format error", func() bool { return obs.count(EventFormat) == 1 })
	if err := os.Truncate(path, off); err != nil {
		t.Fatal(err)
	}
	more := frames("k", 12, 3, 2, 40)
	appendFrames(t, path, more)
	gotten = append(gotten, collect(t, items, len(more), 10*time.Second)...)
	if err := sameFrames(gotten, slices.Concat(fs[:lost], more)); err != nil {
		t.Fatal(err)
	}
}

// TestDamageRepairedAfterReadOn: a live follower read on past damage;
// streamd repair --force then cuts the file where writers find the damage
// (below the read position), and a writer appends: the follower reads the
// new frames from there, not the whole file again. Frames whose checksum
// does not match are cut only when no good frame follows them. The
// follower either sees the file shrink, or, when the appends took it past
// the read position again before it looked, sees the bytes at the cut
// change.
func TestDamageRepairedAfterReadOn(t *testing.T) {
	// A long key puts more than the first 64 bytes of the frames where the
	// cut is alike: the key, the shard, the high bytes of the sequence.
	for _, key := range []string{"k", strings.Repeat("long-key.", 7)} {
		checksum := func(b []byte, off int64) { b[off+int64(len(key))+30] ^= 0xFF } // a payload byte
		for _, tc := range []struct {
			name    string
			damages map[int]func([]byte, int64) // by frame
		}{
			{"key", map[int]func([]byte, int64){5: damageKey}},
			{"checksum then key", map[int]func([]byte, int64){2: checksum, 8: damageKey}},
			{"checksum last", map[int]func([]byte, int64){11: checksum}},
		} {
			for _, grownBack := range []bool{false, true} {
				name := fmt.Sprintf("%s, key of %d bytes, shrunk", tc.name, len(key))
				if grownBack {
					name = fmt.Sprintf("%s, key of %d bytes, grown back", tc.name, len(key))
				}
				t.Run(name, func(t *testing.T) {
					path := filepath.Join(t.TempDir(), "d.ss")
					fs := frames(key, 1, 12, 1, 40)
					writeFile(t, path, streamfile.Header{FileName: "d.ss", CreatedAtMs: 1, BeaconInterval: 64 << 10}, fs)
					b, err := os.ReadFile(path)
					if err != nil {
						t.Fatal(err)
					}
					var read []streamfile.Frame // what a follower that skips the damage reads
					off := int64(streamfile.HeaderSize)
					for i, f := range fs {
						if damage := tc.damages[i]; damage != nil {
							damage(b, off)
						} else {
							read = append(read, f)
						}
						off += int64(len(f.Key)) + 32 + int64(len(f.Payload))
					}
					if err := os.WriteFile(path, b, 0o644); err != nil {
						t.Fatal(err)
					}
					// Enough to take the file past the read position again.
					more := frames(key, 100, 12, 2, 40)
					repair := func() error {
						_, _, err := streamfile.Repair(path, true, func(*streamfile.DamageError) {})
						return err
					}
					obs := newObserver()
					var cut atomic.Bool
					onWait := func() {
						// On the follower's goroutine, once it read to the end
						// past the damage: it looks at the file only after both.
						if !grownBack || cut.Load() || obs.count(EventChecksum)+obs.count(EventFormat) != len(tc.damages) {
							return
						}
						cut.Store(true)
						if err := repair(); err != nil {
							t.Error(err)
							return
						}
						w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{})
						if err != nil {
							t.Error(err)
							return
						}
						if err := errors.Join(w.Append(more...), w.Close()); err != nil {
							t.Error(err)
						}
					}
					fl, err := New(Options{Path: path, PollInterval: 20 * time.Millisecond, Observer: obs, Logger: testLogger(t), OnWait: onWait})
					if err != nil {
						t.Fatal(err)
					}
					defer fl.Close()
					items, stop := follow(t, fl)
					defer stop()
					gotten := collect(t, items, len(read), 10*time.Second)
					if !grownBack {
						waitFor(t, 10*time.Second, "the damage skipped", func() bool { return obs.count(EventChecksum)+obs.count(EventFormat) == len(tc.damages) })
						if err := repair(); err != nil {
							t.Fatal(err)
						}
						waitFor(t, 10*time.Second, "the cut seen", func() bool { return obs.count(EventTruncated) == 1 })
						appendFrames(t, path, more)
					}
					gotten = append(gotten, collect(t, items, len(more), 10*time.Second)...)
					if err := sameFrames(gotten, slices.Concat(read, more)); err != nil {
						t.Fatal(err)
					}
					if obs.count(EventTruncated) != 1 {
						t.Errorf("observer: %v, want the cut counted once", obs)
					}
				})
			}
		}
	}
}

// TestDamageLeftOutLogged: two frames with bad checksums met within
// ratelog.Every: the first is logged at once, and the second, which the
// limit left out, once Every passed, while the follower waits, though no
// damage follows; or when the follower closes (a stop), if sooner.
func TestDamageLeftOutLogged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		close bool
	}{{"once Every passed", false}, {"at close", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path, fs, _ := damagedFile(t, 3, damagePayload)
			off := damageFrame(t, path, fs, 8, damagePayload)
			var logs testutil.SyncBuffer
			fl, err := New(Options{Path: path, PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			items, stop := follow(t, fl)
			defer stop()
			collect(t, items, len(fs)-2, 10*time.Second)
			if n := strings.Count(logs.String(), "corrupt frame; skipping it"); n != 1 {
				t.Fatalf("%d lines about the first damage, want 1:\n%s", n, logs.String())
			}
			want := fmt.Sprintf(`msg="corrupt frames skipped since the last line, left out of the log" component=tail path=%s count=1 last_offset=%d`, path, off)
			if !tc.close {
				waitFor(t, ratelog.Every+5*time.Second, "the line of the damage left out", func() bool { return strings.Contains(logs.String(), want) })
				return
			}
			stop()
			fl.Close()
			if !strings.Contains(logs.String(), want) {
				t.Fatalf("the damage left out is not logged at Close:\n%s", logs.String())
			}
		})
	}
}

// TestResumeAfterDamagedFrame: a stored position shortly after a damaged
// frame, which the follower skipped before the restart, is where it
// resumes: the damage does not make the beacon before the position
// suspect, nor the file read again from its beginning.
func TestResumeAfterDamagedFrame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.ss")
	fs := frames("k", 1, 60, 1, 40)
	writeFile(t, path, streamfile.Header{FileName: "d.ss", CreatedAtMs: 1, BeaconInterval: 1024}, fs)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var offsets []int64
	d := streamfile.NewDecoder(bytes.NewReader(b), streamfile.Header{FileName: "d.ss", CreatedAtMs: 1, BeaconInterval: 1024}, streamfile.HeaderSize)
	for {
		r, err := d.Next()
		if err != nil {
			break
		}
		offsets = append(offsets, r.Offset)
	}
	hit := slices.IndexFunc(offsets, func(o int64) bool { return o > 3072+64 }) // a frame in the interval before 4096
	at := slices.IndexFunc(offsets, func(o int64) bool { return o > 4096+10 })  // the first after the beacon at 4096
	damageKey(b, offsets[hit])
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	fl, err := New(Options{Path: path, Replay: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	id := fl.Position().File
	fl.Close()
	obs := newObserver()
	fl, err = New(Options{Path: path, Replay: true, Resume: &Position{File: id, Offset: offsets[at]}, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	r, err := fl.Next(t.Context())
	if err != nil || r.Offset != offsets[at] || obs.count(EventTruncated) != 0 {
		t.Fatalf("resumed with %v, %v (observer %v); want the record at %d (seq %d)", r, err, obs, offsets[at], fs[at].Seq)
	}
}

// TestSkipDamagedBeaconInFrame: a damaged marker in a beacon that a frame
// spans loses that frame alone: the follower reads on at the first whole
// frame after the beacon, not past the beacon after it.
func TestSkipDamagedBeaconInFrame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.ss")
	h := streamfile.Header{FileName: "d.ss", CreatedAtMs: 1, BeaconInterval: 1024}
	fs := frames("k", 1, 40, 1, 100)
	writeFile(t, path, h, fs)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var offsets []int64
	d := streamfile.NewDecoder(bytes.NewReader(b), h, streamfile.HeaderSize)
	for {
		r, err := d.Next()
		if err != nil {
			break
		}
		offsets = append(offsets, r.Offset)
	}
	beacon := int64(-1) // one that a frame spans, with a marker
	for at := int64(1024); at < int64(len(b)) && beacon < 0; at += 1024 {
		if binary.BigEndian.Uint32(b[at+1:]) != 0 && b[at+5] != 0 {
			beacon = at
		}
	}
	if beacon < 0 {
		t.Fatal("no beacon that a frame spans")
	}
	b[beacon+7] = '!' // the first marker's key
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	lost := slices.IndexFunc(offsets, func(o int64) bool { return o > beacon }) - 1 // the frame that spans it
	fl, err := New(Options{Path: path, Replay: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	var gotten []got
	for {
		r, err := fl.Next(t.Context())
		if err != nil {
			break
		}
		gotten = append(gotten, copyRecord(r))
	}
	if err := sameFrames(gotten, slices.Concat(fs[:lost], fs[lost+1:])); err != nil {
		t.Fatalf("beacon %d damaged, the frame at %d spanning it: %v", beacon, offsets[lost], err)
	}
}

// TestResumeAfterDamageSameInterval: a stored position after a damaged
// frame with no beacon between them is where the follower resumes: the
// check of the position steps over the damage as a follower does.
func TestResumeAfterDamageSameInterval(t *testing.T) {
	path, fs, _ := damagedFile(t, 5, damageKey)
	fl, err := New(Options{Path: path, Replay: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for range 7 { // past the damaged frame, the sixth
		if _, err := fl.Next(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	pos := fl.Position()
	fl.Close()
	obs := newObserver()
	fl, err = New(Options{Path: path, Replay: true, Resume: &pos, Observer: obs, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	r, err := fl.Next(t.Context())
	if err != nil || r.Seq != fs[8].Seq || obs.count(EventTruncated) != 0 {
		t.Fatalf("resumed at %d with %v, %v (observer %v); want seq %d", pos.Offset, r, err, obs, fs[8].Seq)
	}
}
