package offsets

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/streamd/streamd/streamfile"
)

func testSettled(offset int64, key string) Settled {
	return Settled{
		Stream: "/s/orders.ss",
		File:   streamfile.Identity{Ino: 2, FileName: "orders", CreatedAtMs: 3},
		Offset: offset,
		Key:    key,
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
	for _, tc := range []struct{ name, data, want string }{
		{"empty", "", "empty"},
		{"torn", `{"version":1,"subscriptions":{"b":{"stream":"/s`, "unexpected EOF"},
		{"newer", `{"version":2,"subscriptions":{}}`, "unsupported version 2"},
		{"unknown field", `{"version":1,"subscriptions":{},"extra":1}`, `unknown field "extra"`},
		{"no stream", `{"version":1,"subscriptions":{"b":{"stream":"","file":{"ino":1,"file_name":"o","created_at_ms":1},"offset":10,"key":"k","renamed_from":[],"records":[[20,30,1,1]]}}}`, "no stream path"},
		{"record before offset", `{"version":1,"subscriptions":{"b":{"stream":"/s","file":{"ino":1,"file_name":"o","created_at_ms":1},"offset":10,"key":"k","renamed_from":[],"records":[[5,30,1,1]]}}}`, "not after offset 10"},
		{"records out of order", `{"version":1,"subscriptions":{"b":{"stream":"/s","file":{"ino":1,"file_name":"o","created_at_ms":1},"offset":10,"key":"k","renamed_from":[],"records":[[40,50,2,1],[20,30,1,1]]}}}`, "not after offset 50"},
		{"empty record", `{"version":1,"subscriptions":{"b":{"stream":"/s","file":{"ino":1,"file_name":"o","created_at_ms":1},"offset":10,"key":"k","renamed_from":[],"records":[[20,20,1,1]]}}}`, "[20, 20)"},
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
// others' kept.
func TestForgetSettled(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
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
