package envelope

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"testing"
	"unicode/utf8"
)

// FuzzDecode checks that Decode never panics, agrees with a direct reading of
// settlement.md §9.4, returns lowercased unique names, and that whatever it
// returns encodes, in either mode, to a record that decodes to the same
// headers and payload.
func FuzzDecode(f *testing.F) {
	for _, v := range vectors {
		f.Add([]byte(v.record))
	}
	f.Add([]byte(frame(rs1Prefix, []byte("garbage\nX-A :  1 \nx-a: 2\n"), []byte("p"))))
	f.Add([]byte(frame(rs1Prefix, []byte("x-\xff: caf\xc3\r\n"), nil)))
	f.Add([]byte(frame(rs2Prefix, rs2Block("X-A", "1", "x-b", "\x00\xff", "x-a", "2"), []byte("p"))))
	f.Add([]byte(frame(rs2Prefix, rs2Block("x-a", "1")[:5], []byte("p"))))
	f.Add([]byte(frameLen(rs1Prefix, 100, []byte("x: 1\n"), nil)))
	f.Add([]byte("rs1:AAAAAB=="))
	f.Fuzz(func(t *testing.T, record []byte) {
		original := bytes.Clone(record)
		h, p := Decode(record)
		if !bytes.Equal(record, original) {
			t.Fatalf("Decode modified its input")
		}
		wantH, wantP := decodeReference(record)
		if !sameHeaders(h, wantH) || !bytes.Equal(p, wantP) {
			t.Fatalf("Decode(%q) = %s, %q; the reference gives %s, %q", record, fmtHeaders(h), p, fmtHeaders(wantH), wantP)
		}
		seen := make(map[string]bool, len(h))
		for _, e := range h {
			if lowerASCII(e.Name) != e.Name || seen[e.Name] {
				t.Fatalf("Decode(%q) headers %s: names not lowercased and unique", record, fmtHeaders(h))
			}
			seen[e.Name] = true
		}
		for _, line := range []bool{false, true} {
			again := Encode(h, p, line)
			h2, p2 := Decode(again)
			if !sameHeaders(h2, h) || !bytes.Equal(p2, p) {
				t.Fatalf("line=%v: %s, %q encodes to %q, which decodes to %s, %q",
					line, fmtHeaders(h), p, again, fmtHeaders(h2), p2)
			}
		}
	})
}

// FuzzRoundTrip checks that any headers and payload survive Encode then
// Decode in both modes, with names lowercased (and, if not UTF-8, made
// valid), and that a line record is always safe to print as a line.
//
// spec lists the headers: a length byte and that many bytes of name, then a
// length byte and that many bytes of value, repeated; a short tail is cut to
// what is left.
func FuzzRoundTrip(f *testing.F) {
	for _, v := range vectors {
		f.Add(headerSpec(v.headers), []byte(v.payload), v.line)
	}
	f.Add(headerSpec(hdrs("x:a", " v\r", "x-b", "\xff")), []byte(" rs2:"), true)
	f.Add(headerSpec(Headers{{Name: "X-\xff", Value: []byte("1")}, {Name: "x-\xfe", Value: []byte("2")}}), []byte{}, false)
	f.Fuzz(func(t *testing.T, spec, payload []byte, line bool) {
		var h, want Headers
		for len(spec) > 0 {
			var name, value []byte
			name, spec = cutSpec(spec)
			value, spec = cutSpec(spec)
			h.Set(string(name), value)
		}
		for _, e := range h {
			want.Set(string(appendLossy(nil, e.Name)), e.Value)
		}
		record := Encode(h, payload, line)
		if !needsEnvelope(h, payload, line) && !bytes.Equal(record, payload) {
			t.Fatalf("Encode(%s, %q, %v) = %q, want the payload unchanged", fmtHeaders(h), payload, line, record)
		}
		if line && !fitsLine(record) {
			t.Fatalf("Encode(%s, %q, line) = %q, which does not fit a line", fmtHeaders(h), payload, record)
		}
		gotH, gotP := Decode(record)
		if !sameHeaders(gotH, want) || !bytes.Equal(gotP, payload) {
			t.Fatalf("Encode(%s, %q, %v) = %q, which decodes to %s, %q",
				fmtHeaders(h), payload, line, record, fmtHeaders(gotH), gotP)
		}
	})
}

// cutSpec splits one length-prefixed field off a FuzzRoundTrip spec.
func cutSpec(spec []byte) (field, rest []byte) {
	if len(spec) == 0 {
		return nil, nil
	}
	n := min(int(spec[0]), len(spec)-1)
	return spec[1 : 1+n], spec[1+n:]
}

// headerSpec is the FuzzRoundTrip spec of h. Fields longer than 255 bytes
// are cut.
func headerSpec(h Headers) []byte {
	var spec []byte
	for _, e := range h {
		for _, f := range [][]byte{[]byte(e.Name), e.Value} {
			f = f[:min(len(f), 255)]
			spec = append(append(spec, byte(len(f))), f...)
		}
	}
	return spec
}

// decodeReference is settlement.md §9.4 read literally, kept simple as an
// oracle for Decode.
func decodeReference(record []byte) (Headers, []byte) {
	plain := func() (Headers, []byte) { return nil, record }
	if !utf8.Valid(record) {
		return plain()
	}
	rs1 := bytes.HasPrefix(record, []byte("rs1:"))
	if !rs1 && !bytes.HasPrefix(record, []byte("rs2:")) {
		return plain()
	}
	text := string(record[4:])
	if bytes.ContainsAny(record[4:], "\r\n") {
		return plain()
	}
	framed, err := base64.StdEncoding.Strict().DecodeString(text)
	if err != nil || len(framed) < 4 || uint64(len(framed)) < 4+uint64(binary.BigEndian.Uint32(framed)) {
		return plain()
	}
	block := framed[4 : 4+binary.BigEndian.Uint32(framed)]
	payload := framed[4+len(block):]
	var h Headers
	if rs1 {
		for _, line := range bytes.Split(appendLossy(nil, block), []byte("\n")) {
			line = bytes.TrimSuffix(line, []byte("\r"))
			if name, value, ok := bytes.Cut(line, []byte(":")); ok {
				h.Set(string(bytes.TrimSpace(name)), bytes.TrimSpace(value))
			}
		}
	} else {
		for len(block) > 0 {
			if len(block) < 4 || uint64(len(block)-4) < uint64(binary.BigEndian.Uint32(block)) {
				return plain()
			}
			name := block[4 : 4+binary.BigEndian.Uint32(block)]
			block = block[4+len(name):]
			if !utf8.Valid(name) || len(block) < 4 || uint64(len(block)-4) < uint64(binary.BigEndian.Uint32(block)) {
				return plain()
			}
			value := block[4 : 4+binary.BigEndian.Uint32(block)]
			block = block[4+len(value):]
			h.Set(string(name), value)
		}
	}
	if len(h) == 0 {
		h = nil
	}
	return h, payload
}
