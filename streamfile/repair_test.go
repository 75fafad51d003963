package streamfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRepairKeepsReadRecords: Repair refuses, changing nothing, to cut off
// records that readers skipping the damage read after it (here: the key
// of a frame in the middle made invalid, the size of another made to run
// into the frames after it, or over the decoder's limit and past the
// file's end, which no record of that size could reach whole), and says
// how many of each key; with force it truncates at the damage.
func TestRepairKeepsReadRecords(t *testing.T) {
	path, frames := writeSeekFile(t, 1024, 400, 70, []string{"a", "b"})
	_, offsets := readFrames(t, path)
	intact, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const damaged = 150 // the frame damaged
	at := offsets[damaged]
	for name, damage := range map[string]func(b []byte){
		"key":  func(b []byte) { b[at+1] = '!' },                                        // the key's first byte
		"size": func(b []byte) { b[at+1+int64(len(frames[damaged].Key))+24+2] ^= 0x04 }, // 1 KiB more payload
		"size over the limit, past the end": func(b []byte) { // 1 GiB more
			b[at+1+int64(len(frames[damaged].Key))+24] ^= 0x40
		},
	} {
		t.Run(name, func(t *testing.T) {
			data := slices.Clone(intact)
			damage(data)
			p := filepath.Join(t.TempDir(), "damaged.ss")
			os.WriteFile(p, data, 0o644)
			_, _, err := Repair(p, false, func(*DamageError) { t.Error("discard called for a refused repair") })
			var le *LossError
			if !errors.As(err, &le) || le.Damage.Offset != at {
				t.Fatalf("Repair: %v; want a LossError for the damage at %d", err, at)
			}
			afterBeacon := 0 // the frames a reader finds at the latest: those after the next beacon
			last := map[string]uint64{}
			for i, fr := range frames[damaged+1:] {
				if offsets[damaged+1+i] > (at/1024+2)*1024 {
					afterBeacon++
				}
				last[fr.Key] = fr.Seq
			}
			if n := le.Count(); n < afterBeacon || n > len(frames)-damaged-1 {
				t.Errorf("%d records said lost, want between %d and %d", n, afterBeacon, len(frames)-damaged-1)
			}
			for _, k := range le.Records {
				if k.LastSeq != last[k.Key] {
					t.Errorf("key %s: last seq %d, want %d", k.Key, k.LastSeq, last[k.Key])
				}
			}
			checkRefusedThenForced(t, p, data, at)
		})
	}
}

// TestRepairOversize: a frame whose payload size is over the decoder's
// limit may be a whole record of another writer: Repair refuses to cut it
// off without force, changing nothing, also when a frame with a bad
// checksum before it is where readers stop.
func TestRepairOversize(t *testing.T) {
	for _, badChecksumBefore := range []bool{false, true} {
		t.Run(fmt.Sprintf("bad checksum before=%v", badChecksumBefore), func(t *testing.T) {
			path, frames := writeSeekFile(t, 1024, 50, 70, []string{"a"})
			_, offsets := readFrames(t, path)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			last := len(frames) - 1 // nothing readers read follows it
			at := offsets[last]
			binary.BigEndian.PutUint32(data[at+1+int64(len(frames[last].Key))+24:], DefaultMaxPayload+1)
			cut := at
			if badChecksumBefore {
				cut = offsets[last-1]
				data[at-4] ^= 0xFF // the payload's last byte
			}
			os.WriteFile(path, data, 0o644)
			_, _, err = Repair(path, false, func(*DamageError) { t.Error("discard called for a refused repair") })
			var oe *OversizeError
			if !errors.As(err, &oe) || oe.Damage.Offset != cut || oe.Offset != at || oe.PayloadSize != DefaultMaxPayload+1 {
				t.Fatalf("Repair: %v; want an OversizeError for the frame at %d, the cut at %d", err, at, cut)
			}
			checkRefusedThenForced(t, path, data, cut)
		})
	}
}

// checkRefusedThenForced checks that a refused repair left the file at
// path holding data, and that a forced one cuts it to size.
func checkRefusedThenForced(t *testing.T, path string, data []byte, size int64) {
	t.Helper()
	if after, _ := os.ReadFile(path); !slices.Equal(after, data) {
		t.Fatal("a refused repair changed the file")
	}
	if _, _, err := Repair(path, true, func(*DamageError) {}); err != nil {
		t.Fatalf("Repair with force: %v", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != size {
		t.Errorf("repaired size %d, want %d", fi.Size(), size)
	}
}
