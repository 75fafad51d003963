package pipe

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// vectorDir holds the shared stdio test vectors (testdata/stdio/README.md).
var vectorDir = filepath.Join("..", "testdata", "stdio")

// validRecord is one record of valid.expected.ndjson or crlf.expected.ndjson.
type validRecord struct {
	Line            int     `json:"line"`
	Input           string  `json:"input"`
	HasHeader       bool    `json:"has_header"`
	Timestamp       *string `json:"timestamp"`
	TimestampUnixNS *int64  `json:"timestamp_unix_ns"`
	StreamKey       *string `json:"stream_key"`
	Sequence        *uint64 `json:"sequence"`
	ShardID         *uint64 `json:"shard_id"`
	Payload         string  `json:"payload"`
	Effective       struct {
		StreamKey string `json:"stream_key"`
		ShardID   uint64 `json:"shard_id"`
		Sequence  uint64 `json:"sequence"`
	} `json:"effective"`
	Note string `json:"note"`
}

// invalidRecord is one record of invalid.expected.ndjson.
type invalidRecord struct {
	Line   int    `json:"line"`
	Input  string `json:"input"`
	Error  string `json:"error"`
	Part   string `json:"part"`
	Reason string `json:"reason"`
}

// producerRecord is one record of producer.expected.ndjson.
type producerRecord struct {
	Send struct {
		StreamKey string `json:"stream_key"`
		Payload   string `json:"payload"`
	} `json:"send"`
	Stdout *string `json:"stdout"`
	Note   string  `json:"note"`
}

// readLines returns the lines of a vector file split on '\n' only, byte for
// byte. Every vector file ends with '\n'.
func readLines(t testing.TB, name string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(vectorDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(data, []byte{'\n'}) {
		t.Fatalf("%s: does not end with a newline (was the file edited?)", name)
	}
	return bytes.Split(data[:len(data)-1], []byte{'\n'})
}

// readRecords decodes an ndjson vector file strictly: an unknown field means
// the schema changed and the test must follow.
func readRecords[T any](t *testing.T, name string) []T {
	t.Helper()
	f, err := os.Open(filepath.Join(vectorDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var out []T
	for {
		var rec T
		err := dec.Decode(&rec)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: record %d: %v", name, len(out)+1, err)
		}
		out = append(out, rec)
	}
}

// TestValidVectors checks every line of valid.txt and crlf.txt against its
// expected record, with one Sequencer per file read top to bottom.
func TestValidVectors(t *testing.T) {
	for _, name := range []string{"valid", "crlf"} {
		t.Run(name, func(t *testing.T) {
			lines := readLines(t, name+".txt")
			records := readRecords[validRecord](t, name+".expected.ndjson")
			if len(lines) != len(records) {
				t.Fatalf("%d lines in %s.txt, %d records in %s.expected.ndjson", len(lines), name, len(records), name)
			}
			var seq Sequencer
			for i, line := range lines {
				want := records[i]
				if want.Line != i+1 || want.Input != string(line) {
					t.Fatalf("line %d: record is for line %d %q, file has %q", i+1, want.Line, want.Input, line)
				}
				got, err := ParseLine(line)
				if err != nil {
					t.Fatalf("line %d %q: %v", i+1, line, err)
				}
				checkLine(t, i+1, got, want)
				key, shard, sequence := seq.Assign(&got)
				if key != want.Effective.StreamKey || shard != want.Effective.ShardID || sequence != want.Effective.Sequence {
					t.Errorf("line %d %q: effective (%q, %d, %d), want (%q, %d, %d)", i+1, line,
						key, shard, sequence, want.Effective.StreamKey, want.Effective.ShardID, want.Effective.Sequence)
				}
			}
		})
	}
}

// checkLine compares a parsed line with its expected record.
func checkLine(t *testing.T, n int, got Line, want validRecord) {
	t.Helper()
	if got.HasHeader != want.HasHeader {
		t.Errorf("line %d %q: HasHeader %v, want %v", n, want.Input, got.HasHeader, want.HasHeader)
	}
	if got.HasTimestamp != (want.Timestamp != nil) {
		t.Errorf("line %d %q: HasTimestamp %v, want %v", n, want.Input, got.HasTimestamp, want.Timestamp != nil)
	} else if got.HasTimestamp {
		if s := got.Timestamp.Format("2006-01-02T15:04:05.000000000Z07:00"); s != *want.Timestamp {
			t.Errorf("line %d %q: timestamp %s, want %s", n, want.Input, s, *want.Timestamp)
		}
		if want.TimestampUnixNS == nil || got.Timestamp.UnixNano() != *want.TimestampUnixNS {
			t.Errorf("line %d %q: timestamp_unix_ns %d, want %v", n, want.Input, got.Timestamp.UnixNano(), want.TimestampUnixNS)
		}
		if got.Timestamp.Location() != time.UTC {
			t.Errorf("line %d %q: timestamp location %v, want UTC", n, want.Input, got.Timestamp.Location())
		}
	}
	if got.HasStreamKey != (want.StreamKey != nil) || got.HasStreamKey && string(got.StreamKey) != *want.StreamKey {
		t.Errorf("line %d %q: stream key %v %q, want %s", n, want.Input, got.HasStreamKey, got.StreamKey, jsonString(want.StreamKey))
	}
	if got.HasSequence != (want.Sequence != nil) || got.HasSequence && got.Sequence != *want.Sequence {
		t.Errorf("line %d %q: sequence %v %d, want %s", n, want.Input, got.HasSequence, got.Sequence, jsonString(want.Sequence))
	}
	if got.HasShardID != (want.ShardID != nil) || got.HasShardID && got.ShardID != *want.ShardID {
		t.Errorf("line %d %q: shard id %v %d, want %s", n, want.Input, got.HasShardID, got.ShardID, jsonString(want.ShardID))
	}
	if string(got.Payload) != want.Payload {
		t.Errorf("line %d %q: payload %q, want %q", n, want.Input, got.Payload, want.Payload)
	}
}

// jsonString renders an optional expected value the way the vectors write it.
func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// TestInvalidVectors parses every line of invalid.txt on its own and checks
// the offending part.
func TestInvalidVectors(t *testing.T) {
	lines := readLines(t, "invalid.txt")
	records := readRecords[invalidRecord](t, "invalid.expected.ndjson")
	if len(lines) != len(records) {
		t.Fatalf("%d lines in invalid.txt, %d records in invalid.expected.ndjson", len(lines), len(records))
	}
	for i, line := range lines {
		want := records[i]
		if want.Line != i+1 || want.Input != string(line) {
			t.Fatalf("line %d: record is for line %d %q, file has %q", i+1, want.Line, want.Input, line)
		}
		if want.Error != "Unknown" {
			t.Fatalf("line %d: unexpected error kind %q in the vectors", i+1, want.Error)
		}
		got, err := ParseLine(line)
		var le *LineError
		if !errors.As(err, &le) {
			t.Errorf("line %d %q: got %+v, %v; want a *LineError for part %q (%s)", i+1, line, got, err, want.Part, want.Reason)
			continue
		}
		if le.Part != want.Part {
			t.Errorf("line %d %q: error %q names part %q, want %q (%s)", i+1, line, le, le.Part, want.Part, want.Reason)
		}
		if le.Reason == "" {
			t.Errorf("line %d %q: error has no reason", i+1, line)
		}
	}
}

// TestInvalidUTF8Vector checks that invalid-utf8.txt is rejected as UTF-8.
func TestInvalidUTF8Vector(t *testing.T) {
	for i, line := range readLines(t, "invalid-utf8.txt") {
		_, err := ParseLine(line)
		if !errors.Is(err, ErrInvalidUTF8) {
			t.Errorf("line %d %q: error %v, want ErrInvalidUTF8", i+1, line, err)
		}
	}
}

// TestProducerVector replays producer.expected.ndjson through one Producer.
func TestProducerVector(t *testing.T) {
	now := time.Date(2023, 2, 24, 9, 13, 10, 987654321, time.FixedZone("CET", 3600))
	const ts = "2023-02-24T08:13:10"
	var p Producer
	for i, rec := range readRecords[producerRecord](t, "producer.expected.ndjson") {
		prefix := []byte("previous output")
		got, printed, err := p.Append(prefix, now, rec.Send.StreamKey, []byte(rec.Send.Payload))
		if err != nil {
			t.Fatalf("record %d: %v", i+1, err)
		}
		if !bytes.HasPrefix(got, []byte("previous output")) {
			t.Fatalf("record %d: dst prefix clobbered: %q", i+1, got)
		}
		got = got[len(prefix):]
		if rec.Stdout == nil {
			if printed || len(got) != 0 {
				t.Errorf("record %d %+v: printed %v %q, want nothing", i+1, rec.Send, printed, got)
			}
			continue
		}
		want := bytes.ReplaceAll([]byte(*rec.Stdout), []byte("<TS>"), []byte(ts))
		if !printed || !bytes.Equal(got, want) {
			t.Errorf("record %d %+v: printed %v %q, want %q", i+1, rec.Send, printed, got, want)
		}
	}
}
