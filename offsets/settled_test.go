package offsets

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/streamfile"
)

func testSettled(offset int64, key string) Settled {
	return Settled{
		Stream:      "/s/orders.ss",
		File:        streamfile.Identity{Ino: 2, FileName: "orders", CreatedAtMs: 3},
		Offset:      offset,
		CommittedAt: time.Date(2026, 12, 3, 12, 0, 0, 500, time.UTC),
		Key:         key,
		Records: []Span{
			{Start: offset + 40, End: offset + 80, Seq: 7, Tag: 1<<62 | 0xbeef},
			{Start: offset + 80, End: offset + 120, Seq: 8, Tag: 9},
		},
	}
}

// TestSettledRoundTrip: what SaveSettled keeps, the next TakeSettled
// returns, once: it removes the file. Subscriptions with no records are
// not kept, and none at all is no file.
func TestSettledRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	renamed := testSettled(4096, "orders")
	renamed.RenamedFrom = []string{"old", "older"}
	saved := map[string]Settled{
		"billing": testSettled(100, "orders"),
		"renamed": renamed,
		"idle":    {Stream: "/s/orders.ss", Offset: 200, Key: "orders"},
	}
	if err := s.SaveSettled(saved); err != nil {
		t.Fatal(err)
	}
	got, err := s.TakeSettled()
	if err != nil {
		t.Fatal(err)
	}
	delete(saved, "idle")
	if !reflect.DeepEqual(got, saved) {
		t.Errorf("TakeSettled = %+v, want %+v", got, saved)
	}
	if _, err := os.Stat(filepath.Join(dir, SettledName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the settled file after TakeSettled: %v, want it removed", err)
	}
	if got, err := s.TakeSettled(); got != nil || err != nil {
		t.Errorf("TakeSettled again = %v, %v, want nothing", got, err)
	}
	if err := s.SaveSettled(map[string]Settled{"idle": {Stream: "/s/orders.ss", Key: "orders"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SettledName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no records kept, and a settled file: %v", err)
	}
}

// TestSettledSync: the stream files are synced before the settled file
// is written (the copies of the records it names must be durable), and a
// failed sync writes no file.
func TestSettledSync(t *testing.T) {
	dir := t.TempDir()
	var syncErr error
	synced := 0
	s := openStore(t, dir, Options{Sync: func() error {
		if _, err := os.Stat(filepath.Join(dir, SettledName)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the settled file exists before the sync: %v", err)
		}
		synced++
		return syncErr
	}})
	syncErr = errors.New("EIO")
	if err := s.SaveSettled(map[string]Settled{"billing": testSettled(100, "orders")}); err == nil || !strings.Contains(err.Error(), "EIO") {
		t.Errorf("SaveSettled with a failed sync: %v, want its error", err)
	}
	if got, err := s.TakeSettled(); got != nil || err != nil {
		t.Errorf("after a failed sync, TakeSettled = %v, %v, want nothing", got, err)
	}
	syncErr = nil
	if err := s.SaveSettled(map[string]Settled{"billing": testSettled(100, "orders")}); err != nil {
		t.Fatal(err)
	}
	if synced != 2 {
		t.Errorf("synced %d times, want 2", synced)
	}
}

// TestSettledBad: a settled file that is not one is reported, removed,
// and gives nothing: its records are delivered again.
func TestSettledBad(t *testing.T) {
	entry := func(e string) string { return `{"version":1,"subscriptions":{"b":` + e + `}}` }
	const good = `{"stream":"/s","file":{"ino":1,"file_name":"o","created_at_ms":1},"offset":10,"committed_at":"2026-12-03T12:00:00.5Z","key":"k","renamed_from":[],"records":[[20,30,1,1]]}`
	for _, tc := range []struct{ name, data, want string }{
		{"empty", "", "empty"},
		{"torn", entry(good)[:40], "JSON ends early"},
		{"after the object", entry(good) + "{}", "unexpected data after the JSON object"},
		{"newer", `{"version":2,"subscriptions":{}}`, "unsupported version 2"},
		{"no version", `{"subscriptions":{}}`, "unsupported version (none)"},
		{"unknown field", `{"version":1,"subscriptions":{},"extra":1}`, `field "extra": unknown`},
		{"missing field", entry(strings.Replace(good, `"key":"k",`, "", 1)), `subscription "b": field "key": missing`},
		{"null", entry(strings.Replace(good, `"renamed_from":[]`, `"renamed_from":null`, 1)), `field "renamed_from": null value`},
		{"twice", `{"version":1,"version":1,"subscriptions":{}}`, `field "version": appears twice`},
		{"device number", entry(strings.Replace(good, `"ino":1`, `"dev":5,"ino":1`, 1)), `field "file.dev": unknown`},
		{"no stream", entry(strings.Replace(good, `"/s"`, `""`, 1)), "no stream path"},
		{"record before offset", entry(strings.Replace(good, "[20,30", "[5,30", 1)), "not after offset 10"},
		{"records out of order", entry(strings.Replace(good, "[[20,30,1,1]]", "[[40,50,2,1],[20,30,1,1]]", 1)), "not after offset 50"},
		{"empty record", entry(strings.Replace(good, "[20,30", "[20,20", 1)), "[20, 20)"},
		{"bad time", entry(strings.Replace(good, `"2026-12-03T12:00:00.5Z"`, `"noon"`, 1)), `committed_at "noon", want the RFC 3339 time of a commit`},
		{"zero time", entry(strings.Replace(good, `"2026-12-03T12:00:00.5Z"`, `"0001-01-01T00:00:00Z"`, 1)), "want the RFC 3339 time of a commit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir, Options{})
			path := filepath.Join(dir, SettledName)
			if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := s.TakeSettled()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("TakeSettled: %v, want an error naming %s and saying %q", err, path, tc.want)
			}
			if got != nil {
				t.Errorf("TakeSettled = %v, want nothing", got)
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the bad settled file after TakeSettled: %v, want it removed", err)
			}
		})
	}
}

// TestForgetSettled: a subscription's settled records are forgotten, the
// others' kept; a bad settled file is removed.
func TestForgetSettled(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	if err := os.WriteFile(filepath.Join(dir, SettledName), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetSettled("a"); err != nil {
		t.Errorf("ForgetSettled with a bad file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, SettledName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the bad settled file after ForgetSettled: %v, want it removed", err)
	}
	if err := s.SaveSettled(map[string]Settled{"a": testSettled(100, "orders"), "b": testSettled(200, "orders")}); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetSettled("a"); err != nil {
		t.Fatal(err)
	}
	got, err := s.TakeSettled()
	if want := map[string]Settled{"b": testSettled(200, "orders")}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("TakeSettled = %v, %v, want %v", got, err, want)
	}
}

// TestSettledBounds: at most maxSettledRecords records of a subscription
// are kept, the first ones; a file too large to read back is not written.
func TestSettledBounds(t *testing.T) {
	t.Parallel()
	s := openStore(t, t.TempDir(), Options{})
	many := func(n int) Settled {
		st := testSettled(100, "orders")
		st.Records = make([]Span, n)
		for i := range st.Records {
			st.Records[i] = Span{Start: 100 + int64(i)*40, End: 140 + int64(i)*40, Seq: uint64(i), Tag: 1<<62 | uint64(i)}
		}
		return st
	}
	st := many(maxSettledRecords + 10)
	if err := s.SaveSettled(map[string]Settled{"big": st}); err != nil {
		t.Fatal(err)
	}
	got, err := s.TakeSettled()
	if err != nil {
		t.Fatal(err)
	}
	if rs := got["big"].Records; len(rs) != maxSettledRecords || rs[len(rs)-1] != st.Records[maxSettledRecords-1] {
		t.Errorf("kept %d records, want the first %d", len(rs), maxSettledRecords)
	}
	tooLarge := testSettled(100, "orders")
	tooLarge.Stream = "/" + strings.Repeat("s", maxSidecarSize)
	if err := s.SaveSettled(map[string]Settled{"big": tooLarge}); err == nil || !strings.Contains(err.Error(), "more than the") {
		t.Errorf("SaveSettled of a file too large: %v, want an error", err)
	}
	if got, err := s.TakeSettled(); got != nil || err != nil {
		t.Errorf("after a file too large, TakeSettled = %d subscriptions, %v, want nothing", len(got), err)
	}
}
