package retrytimer

import "github.com/streamd/streamd/envelope"

// Schedule records of types 1 and 3 are what streamd wrote before a copy
// reached the queue in its final form: they hold the copy's headers and
// payload apart, and the daemon enveloped them when the copy fired. A spool
// written then may still hold such records after an upgrade, so they are
// still read, and their copies fire exactly the bytes the older streamd
// would have written. This file is the one place the package knows of
// envelopes; everything else carries a copy's record without reading it.

// legacyFields are the headers and payload of a type 1 or 3 schedule
// record.
type legacyFields struct {
	headers envelope.Headers
	payload []byte
}

// legacyFields reads the headers and payload of a type 1 or 3 record:
//
//	nheaders u32 | nheaders × (name bytes | value bytes) | payload bytes
//
// Header values and the payload alias d's bytes. A count of headers that the
// rest of the body cannot hold reads as a short field.
func (d *decoder) legacyFields() legacyFields {
	var l legacyFields
	if nh := d.u32(); nh > 0 {
		// Each header takes at least 8 bytes: never allocate for more
		// headers than the body can hold.
		if uint64(nh) > uint64(len(d.b))/8 {
			d.short = true
			return legacyFields{}
		}
		l.headers = make(envelope.Headers, nh)
		for i := range l.headers {
			l.headers[i].Name = string(d.bytes())
			l.headers[i].Value = d.bytes()
		}
	}
	l.payload = d.bytes()
	return l
}

// record returns the bytes an older streamd wrote to the stream file for
// these headers and payload: their envelope for the stream-file transport.
// It shares no memory with l.
func (l legacyFields) record() []byte {
	return envelope.Encode(l.headers, l.payload, false)
}
