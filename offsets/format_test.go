package offsets

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

var update = flag.Bool("update", false, "rewrite testdata/sidecar.golden.json")

// validSidecar is a well-formed sidecar; the rows of corruptSidecars are
// made from it.
const validSidecar = `{
  "version": 2,
  "subscriptions": {
    "billing": {
      "stream": "/s/orders.ss",
      "file": {"ino": 2, "file_name": "orders", "created_at_ms": 3},
      "offset": 4096,
      "last_seq": 17,
      "committed_at": "2025-03-01T12:00:00Z"
    }
  }
}
`

// recovery is what every corrupt-sidecar error ends with.
const recovery = ` (move the file aside to start every subscription from its start_at, ` +
	`or restore it from a backup; "streamd offsets set" can then rewrite a position)`

// replaced returns validSidecar with old replaced by new, which must occur.
func replaced(old, new string) string {
	if !strings.Contains(validSidecar, old) {
		panic(fmt.Sprintf("validSidecar has no %q", old))
	}
	return strings.Replace(validSidecar, old, new, 1)
}

// corruptSidecar is a damaged sidecar and the cause its error names.
type corruptSidecar struct {
	name  string
	data  string
	cause string
}

// corruptSidecars returns the damaged sidecars TestOpenCorrupt tries. It
// is a function, not a variable, so that the helper processes of other
// tests do not build its 16 MiB row when they start.
func corruptSidecars() []corruptSidecar {
	return []corruptSidecar{
		{"empty", "", "the file is empty, likely a write lost in a crash"},
		{"white space", "\n \n", "no JSON value, only white space"},
		{"NUL-filled", strings.Repeat("\x00", 4096), "all 4096 bytes are NUL, likely a write lost in a crash"},
		{"NUL tail", validSidecar[:40] + strings.Repeat("\x00", 100), "NUL byte at offset 40, likely a torn write"},
		{"torn", validSidecar[:100], "JSON ends early at byte 100, likely a torn write"},
		{"torn before last brace", strings.TrimSuffix(validSidecar, "}\n"), fmt.Sprintf("JSON ends early at byte %d, likely a torn write", len(validSidecar)-2)},
		{"invalid JSON", `{"version": 2,}`, "invalid JSON at byte 15: invalid character '}' looking for beginning of object key string"},
		{"trailing data", validSidecar + "\n}\n", fmt.Sprintf("unexpected data after the JSON object at byte %d", len(validSidecar)+1)},
		{"two documents", validSidecar + validSidecar, fmt.Sprintf("unexpected data after the JSON object at byte %d", len(validSidecar))},
		{"not an object", `[{"version": 2}]`, "the JSON value is not an object"},
		{"version 0", replaced(`"version": 2`, `"version": 0`), "unsupported version 0, this streamd reads versions 1 and 2"},
		{"version string", replaced(`"version": 2`, `"version": "2"`), `field "version": "2", want an integer`},
		{"version fraction", replaced(`"version": 2`, `"version": 2.0`), `field "version": 2.0, want an integer`},
		{"no version", `{"subscriptions": {}}`, `field "version": missing`},
		{"version twice", replaced(`"version": 2`, `"version": 1, "version": 2`), `field "version": appears twice`},
		{"unknown field", replaced(`"version": 2`, `"version": 2, "extra": true`), `field "extra": unknown`},
		{"no subscriptions", `{"version": 2}`, `field "subscriptions": missing`},
		{"null subscriptions", `{"version": 2, "subscriptions": null}`, `field "subscriptions": null value`},
		{"subscriptions array", `{"version": 2, "subscriptions": []}`, `field "subscriptions": array, want an object`},
		{"unknown entry field", replaced(`"offset": 4096`, `"offset": 4096, "partition": 0`), `subscription "billing": field "partition": unknown`},
		{"field in other case", replaced(`"offset"`, `"Offset"`), `subscription "billing": field "Offset": unknown`},
		{"unknown identity field", replaced(`"ino": 2`, `"ino": 2, "rdev": 1`), `subscription "billing": field "file.rdev": unknown`},
		{"device number in version 2", replaced(`"ino": 2`, `"dev": 1, "ino": 2`), `subscription "billing": field "file.dev": unknown`},
		{"version 1 without its device number", replaced(`"version": 2`, `"version": 1`), `subscription "billing": field "file.dev": missing`},
		{"negative device number", strings.NewReplacer(`"version": 2`, `"version": 1`, `"ino": 2`, `"dev": -1, "ino": 2`).Replace(validSidecar),
			`subscription "billing": field "file.dev": number -1, want a non-negative integer`},
		{"missing field", replaced(`"last_seq": 17,`, ``), `subscription "billing": field "last_seq": missing`},
		{"missing identity field", replaced(`"ino": 2, `, ``), `subscription "billing": field "file.ino": missing`},
		{"repeated subscription", replaced("}\n  }\n}", "},\n    \"billing\": {}\n  }\n}"), `subscription "billing": appears twice`},
		{"null entry", `{"version": 2, "subscriptions": {"billing": null}}`, `subscription "billing": null value`},
		{"entry not an object", `{"version": 2, "subscriptions": {"billing": 7}}`, `subscription "billing": number, want an object`},
		{"null offset", replaced(`4096`, `null`), `subscription "billing": field "offset": null value`},
		{"offset string", replaced(`4096`, `"4096"`), `subscription "billing": field "offset": string, want an integer`},
		{"offset too large", replaced(`4096`, `1e30`), `subscription "billing": field "offset": number 1e30, want an integer`},
		{"negative offset", replaced(`4096`, `-1`), `subscription "billing": negative offset -1`},
		{"negative inode", replaced(`"ino": 2`, `"ino": -2`), `subscription "billing": field "file.ino": number -2, want a non-negative integer`},
		{"bad time", replaced(`"2025-03-01T12:00:00Z"`, `"yesterday"`), `subscription "billing": field "committed_at": "yesterday", want an RFC 3339 time`},
		{"time out of range", replaced(`"2025-03-01T12:00:00Z"`, `"0000-01-01T00:00:00+01:00"`), `subscription "billing": field "committed_at": "0000-01-01T00:00:00+01:00" is out of range`},
		{"empty name", replaced(`"billing"`, `""`), "empty subscription name"},
		{"too large", validSidecar + strings.Repeat(" ", maxSidecarSize), "larger than 16777216 bytes, the most the file may hold"},
	}
}

// TestOpenNewer: a sidecar of a newer version is refused, file unchanged,
// with the advice of a rollback (run the newer streamd, or restore the
// sidecar of before the upgrade), not that of damage, which would drop the
// retry spool.
func TestOpenNewer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SidecarName)
	data := strings.Replace(validSidecar, `"version": 2`, `"version": 3`, 1)
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "offsets: sidecar " + path + " is of version 3, written by a newer streamd: run that version, or stop and " +
		`restore the sidecar of before the upgrade (the records since then are delivered again); see "Upgrade and roll back" in the README`
	for _, marker := range []string{"", "retry.spool"} {
		if s, err := Open(dir, Options{Marker: marker}); err == nil || err.Error() != want {
			if err == nil {
				s.Close()
			}
			t.Errorf("Open with marker %q:\n got %v\nwant %s", marker, err, want)
		}
	}
	if b, _ := os.ReadFile(path); string(b) != data {
		t.Error("the refused sidecar was changed")
	}
}

// TestOpenCorrupt checks that Open and Load refuse each damaged sidecar
// with an error naming the file, the damage and the way out, and leave the
// file as it was.
func TestOpenCorrupt(t *testing.T) {
	for _, tc := range corruptSidecars() {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, SidecarName)
			if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			want := "offsets: corrupt sidecar " + path + ": " + tc.cause + recovery

			// Twice: a failed Open must release the lock.
			for range 2 {
				s, err := Open(dir, Options{})
				if err == nil {
					s.Close()
					t.Fatal("Open: no error")
				}
				var corrupt *CorruptError
				if !errors.As(err, &corrupt) || err.Error() != want {
					t.Fatalf("Open:\n got %v\nwant %s", err, want)
				}
			}
			if _, err := Load(dir); err == nil || err.Error() != want {
				t.Fatalf("Load:\n got %v\nwant %s", err, want)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, []byte(tc.data)) {
				t.Fatalf("the sidecar changed:\n got %q\nwant %q", got, tc.data)
			}
		})
	}
}

// TestCorruptAdvice follows each way out that a corrupt sidecar's error
// names, to the letter, and checks that Open with the daemon's marker, and
// LoadMarked, succeed after it: with no marker file, the sidecar moved
// aside; with one, both moved aside, or the sidecar moved aside and a
// position stored as "streamd offsets set" stores it (Open without the
// marker). Open and LoadMarked give the same advice.
func TestCorruptAdvice(t *testing.T) {
	const marker = "retry.spool"
	for _, tc := range []struct {
		name       string
		withMarker bool     // the marker file exists
		advice     string   // in the error, MARKER standing for the marker's path
		moveAside  []string // the files the advice moves aside
		set        bool     // then a position is stored, as offsets set does
	}{
		{"unused directory", false, "(move the file aside to start every subscription from its start_at", []string{SidecarName}, false},
		{"both moved aside", true, "or move it aside together with MARKER to start every subscription from its start_at",
			[]string{SidecarName, marker}, false},
		{"offsets set", true, `or move it aside alone and store each subscription's position with "streamd offsets set`,
			[]string{SidecarName}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, SidecarName), []byte("{"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.withMarker {
				if err := os.WriteFile(filepath.Join(dir, marker), []byte("pending"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			opts := Options{Marker: marker}
			_, err := Open(dir, opts)
			var corrupt *CorruptError
			if !errors.As(err, &corrupt) {
				t.Fatalf("Open: %v, want a *CorruptError", err)
			}
			if want := strings.ReplaceAll(tc.advice, "MARKER", filepath.Join(dir, marker)); !strings.Contains(err.Error(), want) {
				t.Fatalf("Open: %v\nwant the advice %q", err, want)
			}
			if _, lerr := LoadMarked(dir, marker); lerr == nil || lerr.Error() != err.Error() {
				t.Fatalf("LoadMarked: %v\nwant %v", lerr, err)
			}

			for _, name := range tc.moveAside {
				if err := os.Rename(filepath.Join(dir, name), filepath.Join(dir, name+".bad")); err != nil {
					t.Fatal(err)
				}
			}
			if tc.set {
				s := openStore(t, dir, Options{})
				mustSet(t, s, "billing", testPosition(100))
				if err := errors.Join(s.Commit(), s.Close()); err != nil {
					t.Fatal(err)
				}
			}
			positions, err := LoadMarked(dir, marker)
			if err != nil {
				t.Fatalf("LoadMarked after following the advice: %v", err)
			}
			s := openStore(t, dir, opts)
			if _, ok := s.Get("billing"); ok != tc.set || len(positions) != len(s.entries) {
				t.Errorf("positions after following the advice: Open %v, LoadMarked %v; want billing's stored: %v", s.entries, positions, tc.set)
			}
		})
	}
}

func TestDecodeValid(t *testing.T) {
	got, err := decode([]byte(validSidecar))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Position{"billing": {
		Stream:      "/s/orders.ss",
		File:        streamfile.Identity{Ino: 2, FileName: "orders", CreatedAtMs: 3},
		Offset:      4096,
		LastSeq:     17,
		CommittedAt: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC),
	}}
	if diff := diffPositions(got, want); diff != "" {
		t.Fatal(diff)
	}
}

// TestDecodeVersion1 reads testdata/sidecar.v1.json, a sidecar as the
// previous streamd wrote it, with the device numbers it no longer keeps:
// its positions are those of TestEncodeGolden, and written again they
// make that test's golden file, of version 2.
func TestDecodeVersion1(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "sidecar.v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := diffPositions(got, goldenPositions); diff != "" {
		t.Fatal(diff)
	}
	encoded, err := encode(got)
	if err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile(filepath.Join("testdata", "sidecar.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encoded, golden) {
		t.Fatalf("written again:\n%s\nwant:\n%s", encoded, golden)
	}
}

// goldenPositions are the positions of testdata/sidecar.golden.json.
var goldenPositions = map[string]Position{
	"billing": {
		Stream:      "/var/lib/seastreamer/orders.ss",
		File:        streamfile.Identity{Ino: 1311020, FileName: "orders", CreatedAtMs: 1694767177437},
		Offset:      4096,
		LastSeq:     17,
		CommittedAt: time.Date(2025, 3, 1, 12, 0, 0, 500_000_000, time.UTC),
	},
	"audit": {
		Stream:      "/var/lib/seastreamer/orders.ss",
		File:        streamfile.Identity{Ino: 1311020, FileName: "orders", CreatedAtMs: 1694767177437},
		Offset:      128,
		CommittedAt: time.Date(2025, 3, 1, 13, 0, 0, 0, time.FixedZone("CET", 3600)),
	},
}

// TestEncodeGolden pins the bytes of the format. Run with -update to
// rewrite the golden file after a deliberate change.
func TestEncodeGolden(t *testing.T) {
	got, err := encode(goldenPositions)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "sidecar.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encode differs from %s (run go test ./offsets -run TestEncodeGolden -update to accept):\n%s", golden, got)
	}
	back, err := decode(got)
	if err != nil {
		t.Fatal(err)
	}
	if diff := diffPositions(back, goldenPositions); diff != "" {
		t.Fatal(diff)
	}
}

// FuzzDecodeSidecar checks that decode never panics and that whatever it
// accepts encodes to a sidecar that decodes to the same positions and
// encodes to the same bytes again.
func FuzzDecodeSidecar(f *testing.F) {
	f.Add([]byte(validSidecar))
	for _, name := range []string{"sidecar.golden.json", "sidecar.v1.json"} {
		if golden, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(golden)
		}
	}
	for _, tc := range corruptSidecars() {
		if len(tc.data) <= 1<<16 {
			f.Add([]byte(tc.data))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		positions, err := decode(data)
		if err != nil {
			return
		}
		encoded, err := encode(positions)
		if err != nil {
			t.Fatalf("encode of decoded positions: %v", err)
		}
		back, err := decode(encoded)
		if err != nil {
			t.Fatalf("decode of encoded positions: %v\n%s", err, encoded)
		}
		if diff := diffPositions(back, positions); diff != "" {
			t.Fatal(diff)
		}
		again, err := encode(back)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, encoded) {
			t.Fatalf("encoding is not stable:\n%s\n%s", encoded, again)
		}
	})
}

// diffPositions describes how got differs from want, or returns "".
func diffPositions(got, want map[string]Position) string {
	var b strings.Builder
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			fmt.Fprintf(&b, "%q: missing\n", name)
		case !g.samePlace(w) || !g.CommittedAt.Equal(w.CommittedAt):
			fmt.Fprintf(&b, "%q:\n got %+v\nwant %+v\n", name, g, w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			fmt.Fprintf(&b, "%q: unexpected\n", name)
		}
	}
	return b.String()
}
