package envelope

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// checkParse fails t unless p parses record as Decode decodes it: the
// same verdict, headers and payload, without changing record.
func checkParse(t testing.TB, p *Parser, record []byte) {
	t.Helper()
	original := bytes.Clone(record)
	wantH, wantP := Decode(record)
	// Decode returns a plain record itself; an envelope's payload is
	// decoded into new memory, even when it is empty.
	plain := wantH == nil && len(wantP) == len(record) && (len(record) == 0 || &wantP[0] == &record[0])
	h, ok := p.Parse(record)
	got := p.Payload()
	switch {
	case ok == plain:
		t.Fatalf("Parse(%q) reports envelope %v; Decode gives %s, %q", record, ok, fmtHeaders(wantH), wantP)
	case !ok && (h != nil || got != nil):
		t.Fatalf("Parse(%q) reports a plain record, with headers %s and payload %q", record, fmtHeaders(h), got)
	case ok && (!sameHeaders(h, wantH) || !bytes.Equal(got, wantP)):
		t.Fatalf("Parse(%q) = %s, payload %q; Decode gives %s, %q", record, fmtHeaders(h), got, fmtHeaders(wantH), wantP)
	case !bytes.Equal(record, original):
		t.Fatalf("Parse(%q) modified its input", original)
	case !plain && !Prefixed(record):
		t.Fatalf("Prefixed(%q) reports false for an envelope", record)
	}
	// PeekHeader finds what peek's headers hold, and leaves Check to
	// decide as Parse does.
	names := []string{"x-a", "X-A", "x", "x-streamd-origin", "missing"}
	for _, e := range wantH {
		names = append(names, e.Name, strings.ToUpper(e.Name))
	}
	for _, name := range names {
		ph, peeked := p.peek(record)
		want, wantFound := ph.Get(name)
		want = bytes.Clone(want)
		v, found := p.PeekHeader(record, name)
		if found != (peeked && wantFound) || !bytes.Equal(v, want) {
			t.Fatalf("PeekHeader(%q, %q) = %q, %v; peek's headers %s hold %q, %v", record, name, v, found, fmtHeaders(ph), want, peeked && wantFound)
		}
		if p.Check() == plain || (!plain && !bytes.Equal(p.Payload(), wantP)) {
			t.Fatalf("after PeekHeader(%q, %q), Check says envelope %v; Decode gives %s, %q", record, name, !plain, fmtHeaders(wantH), wantP)
		}
	}
}

// parseWarmUp is a record a Parser parses before the one under test, so
// that a test also sees what its memory held before: more headers, longer
// values, a longer payload, names in upper case.
var parseWarmUp = Encode(hdrs("X-A", strings.Repeat("a", 300), "X-B", "2", "stream-sequence", "9", "x-c", "3"),
	bytes.Repeat([]byte("warm up "), 200), false)

// FuzzParse is the differential test of Parser against Decode on any
// record: the same verdict, headers and payload, from a fresh Parser and
// from one that parsed another record before (and whose payload it did
// not decode), and again from the same Parser.
func FuzzParse(f *testing.F) {
	for _, v := range vectors {
		f.Add([]byte(v.record))
	}
	for _, s := range []string{
		frame(rs1Prefix, []byte("garbage\nX-A :  1 \nx-a: 2\n"), []byte("p")),
		frame(rs1Prefix, []byte("x-\xff: caf\xc3\r\n"), nil),
		frame(rs1Prefix, []byte("X-Streamd-Origin: billing\n"), []byte("p")),
		frame(rs2Prefix, rs2Block("X-A", "1", "x-b", "\x00\xff", "x-a", "2"), []byte("p")),
		frame(rs2Prefix, rs2Block("x-a", "1")[:5], []byte("p")),
		frameLen(rs1Prefix, 100, []byte("x: 1\n"), nil),
		"rs1:AAAAAB==", "rs1:AAAAAA=", "rs1:AAAAAAA=", "rs2:AAAAAAAA", "rs1:AAAAAA==\n", "rs1:AA==AAAA",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, record []byte) {
		var p Parser
		checkParse(t, &p, record)
		p.Parse(parseWarmUp)
		checkParse(t, &p, record)
		checkParse(t, &p, record)
	})
}

// TestParse runs the records of the Decode tests through one Parser, in
// turn and each after a record that fills its memory, and checks that it
// decides and decodes each as Decode does.
func TestParse(t *testing.T) {
	good := vectors[1].record
	records := map[string]string{
		"sec9.4/missing_padding":     strings.TrimRight(good, "="),
		"sec9.4/extra_padding":       good + "=",
		"sec9.4/three_padding":       "rs1:AAAAAA===",
		"sec9.4/only_padding":        "rs1:====",
		"sec9.4/padding_inside":      "rs1:AA==AAAA",
		"sec9.4/padding_third_only":  "rs1:AAAAAA=A",
		"sec9.4/nonzero_bits_two":    "rs1:AAAAAB==",
		"sec9.4/nonzero_bits_one":    "rs1:AAAAAAB=",
		"sec9.4/zero_bits_one":       "rs1:AAAAAAA=",
		"sec9.4/newline":             good[:20] + "\n" + good[20:],
		"sec9.4/cr_at_end":           good + "\r",
		"sec9.4/url_alphabet":        "rs1:AAAAAACfkpb_",
		"sec9.4/dash":                "rs1:AAAAAACfkpb-",
		"sec9.4/high_byte":           "rs1:AAAAAACfkpb\xc3",
		"sec9.4/nul":                 "rs1:AAAAAACfkpb\x00",
		"sec9.4/decoded_three_bytes": "rs1:AAAA",
		"sec9.4/empty_text":          "rs1:",
		"sec9.4/block_overruns":      frameLen(rs1Prefix, 100, []byte("x: 1\n"), nil),
		"sec9.4/block_fits_exactly":  frame(rs1Prefix, []byte("x: 1\n"), nil),
		"sec9.4/rs2_truncated":       frame(rs2Prefix, rs2Block("x-a", "1")[:10], []byte("p")),
		"sec9.4/rs2_name_not_utf8":   frame(rs2Prefix, rs2Block("x-\xff", "1"), []byte("p")),
		"sec9.4/rs1_not_utf8":        frame(rs1Prefix, []byte("x-a: caf\xc3\nx-\xff: \xe2\x82\xac\xe2\x82\n"), []byte("p")),
		"sec9.4/rs1_duplicates":      frame(rs1Prefix, []byte("garbage\nX-A :  1 \nx-a: 2\n"), []byte("p")),
		"sec9.4/plain":               `{"id":7}`,
		"sec9.4/empty":               "",
	}
	for _, v := range vectors {
		records["item43/"+v.name] = v.record
	}
	for i := range 7 { // every alignment of the block end and the payload against the quanta
		block := fmt.Appendf(nil, "x: %s\n", strings.Repeat("v", i))
		for j := range 4 {
			records[fmt.Sprintf("sec9.3/block_%d_payload_%d", len(block), j)] = frame(rs1Prefix, block, bytes.Repeat([]byte("p"), j))
		}
	}
	// Every character of the text after the block length replaced by each
	// byte that matters to the alphabet check.
	text := frame(rs1Prefix, []byte("a: 1\n"), []byte("payload!"))
	for _, c := range []byte("\x00\x2a+,./09:@AZ[`az{\x7f\x80\xab\xff") {
		for i := 8 + len(rs1Prefix); i < len(text); i++ {
			records[fmt.Sprintf("sec9.4/byte_%#x_at_%d", c, i)] = text[:i] + string(c) + text[i+1:]
		}
	}
	var p Parser
	for name, record := range records {
		t.Run(name, func(t *testing.T) {
			checkParse(t, &p, []byte(record))
			p.Parse(parseWarmUp)
			checkParse(t, &p, []byte(record))
		})
	}
}

// TestParseMemory checks the lifetime rules of Parser: the names of a
// header block seen before are not allocated again, and are the same
// strings; the payload comes from the record as it is when Payload is
// called.
func TestParseMemory(t *testing.T) {
	record := Encode(hdrs("X-Trace-Id", "abc", "content-type", "application/json"), []byte(`{"id":7}`), false)
	var p Parser
	first, _ := p.Parse(record)
	names := []string{first[0].Name, first[1].Name}
	if allocs := testing.AllocsPerRun(100, func() {
		p.Parse(record)
		p.Payload()
	}); allocs != 0 {
		t.Errorf("Parse and Payload of a record seen before: %v allocations, want 0", allocs)
	}
	again, _ := p.Parse(record)
	for i, e := range again {
		if e.Name != names[i] || strings.Clone(e.Name) != "x-trace-id" && i == 0 {
			t.Errorf("header %d is named %q, want %q", i, e.Name, names[i])
		}
	}
	if names[0] != "x-trace-id" || names[1] != "content-type" {
		t.Errorf("names %q, want them lowercased", names)
	}
}

// TestParseManyHeadersMemory checks that a record with more than
// indexAfter headers, which the builder indexes by name, also costs no
// allocation once seen: the index is kept from one record to the next.
func TestParseManyHeadersMemory(t *testing.T) {
	record := Encode(manyHeaders(indexAfter+4), []byte(`{"id":7}`), false)
	var p Parser
	if h, ok := p.Parse(record); !ok || len(h) != indexAfter+4 {
		t.Fatalf("Parse: %d headers, %v; want %d, true", len(h), ok, indexAfter+4)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		p.Parse(record)
		p.Payload()
	}); allocs != 0 {
		t.Errorf("Parse and Payload of a record of %d headers seen before: %v allocations, want 0", indexAfter+4, allocs)
	}
}

// manyHeaders returns n headers of distinct names.
func manyHeaders(n int) Headers {
	var h Headers
	for i := range n {
		h.Set("x-h"+strconv.Itoa(i), []byte("v"+strconv.Itoa(i)))
	}
	return h
}

// TestParseInternBound checks that a stream of ever new names does not
// grow a Parser's memory past maxInterned names, and that names beyond it
// still decode.
func TestParseInternBound(t *testing.T) {
	var p Parser
	for i := range 3 * maxInterned {
		name := "x-h" + strconv.Itoa(i)
		record := Encode(hdrs(name, "v"), nil, false)
		h, ok := p.Parse(record)
		if !ok || len(h) != 1 || h[0].Name != name {
			t.Fatalf("record %d: headers %s, want %s", i, fmtHeaders(h), name)
		}
	}
	if len(p.b.names) != maxInterned {
		t.Errorf("%d names interned, want %d", len(p.b.names), maxInterned)
	}
}

func BenchmarkParse(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 512)
	for _, bc := range []struct {
		name    string
		headers Headers
		payload bool // also decode the payload
	}{
		{"rs1_two_headers_512B/headers", hdrs("x-trace-id", "4bf92f3577b34da6a3ce929d0e0e4736", "content-type", "application/json"), false},
		{"rs1_two_headers_512B/payload", hdrs("x-trace-id", "4bf92f3577b34da6a3ce929d0e0e4736", "content-type", "application/json"), true},
		{"rs2_two_headers_512B/headers", hdrs("x-note", "two\nlines", "content-type", "application/json"), false},
		{"rs1_twelve_headers_512B/headers", manyHeaders(12), false},
	} {
		record := Encode(bc.headers, payload, false)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(record))) // throughput in record bytes
			var p Parser
			for b.Loop() {
				if _, ok := p.Parse(record); !ok {
					b.Fatal("not an envelope")
				}
				if bc.payload {
					p.Payload()
				}
			}
		})
	}
}

// TestPrefixed: only the two prefixes count, whatever follows them.
func TestPrefixed(t *testing.T) {
	for record, want := range map[string]bool{
		"": false, "r": false, "rs1": false, "rs3:AAAA": false, " rs1:": false, `{"id":7}`: false,
		"rs1:": true, "rs2:": true, "rs1:not base64!": true, vectors[1].record: true,
	} {
		if got := Prefixed([]byte(record)); got != want {
			t.Errorf("Prefixed(%q) = %v, want %v", record, got, want)
		}
	}
}

// TestPrefixesShareFirstByte: prefixRS1 tells most plain records from an
// envelope by their first byte alone, which both prefixes share.
func TestPrefixesShareFirstByte(t *testing.T) {
	if rs1Prefix[0] != rs2Prefix[0] {
		t.Fatalf("prefixes %q and %q start differently: prefixRS1's first test must look at both", rs1Prefix, rs2Prefix)
	}
}

// TestParserRelease: once released, a Parser keeps neither the record it
// parsed last (a large one would stay alive until the next) nor the memory
// it decoded a large record into; memory within the limit stays, so that
// parsing, decoding and releasing a small record allocates nothing.
func TestParserRelease(t *testing.T) {
	const limit = 64 << 10
	large := Encode(hdrs("x-big", strings.Repeat("v", 200<<10)), bytes.Repeat([]byte("payload "), 256<<10), false)
	var p Parser
	if _, ok := p.Parse(large); !ok || len(p.Payload()) != 2<<20 {
		t.Fatal("the large record does not parse")
	}
	p.Release(limit)
	if p.text != nil || cap(p.head) > limit || cap(p.payload) > limit {
		t.Errorf("released, the parser keeps the record (%v) and buffers of %d and %d bytes; want none, and at most %d bytes each",
			p.text != nil, cap(p.head), cap(p.payload), limit)
	}
	for _, e := range p.b.h[:cap(p.b.h)] {
		if e.Value != nil {
			t.Errorf("released, the parser keeps header %q", e.Name)
		}
	}
	small := Encode(hdrs("x-trace-id", "abc"), []byte(`{"id":7}`), false)
	checkParse(t, &p, small)
	if allocs := testing.AllocsPerRun(100, func() {
		p.Parse(small)
		p.Payload()
		p.Release(limit)
	}); allocs != 0 {
		t.Errorf("Parse, Payload and Release of a small record: %v allocations, want 0", allocs)
	}
}
