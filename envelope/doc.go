// Package envelope carries message headers inside a payload, in the rs1: and
// rs2: envelope of settlement.md §9.
//
// Neither transport streamd speaks has header fields: a SeaStreamer stream
// file frame holds a stream key and a payload, and a stdio line holds
// bracketed meta and a payload. Settlement still needs headers, above all the
// retry count ([RetryCountHeader]) that caps redelivery, and user headers must
// survive a retry or dead-letter copy. The envelope therefore folds the
// headers and the payload into one payload, in the byte format the reference
// runtime uses, so records written by either side decode on the other.
//
// A record is enveloped only when it has to be: when it has headers, when the
// payload itself starts with rs1: or rs2: (so that it cannot be mistaken for
// an envelope), or, on the pipe transport, when the payload cannot stand alone
// on a line. Any other payload is written unchanged, so a plain message stays
// readable by consumers that know nothing of envelopes. An envelope is the
// prefix rs1: or rs2: followed by padded standard base64 of a big-endian u32
// block length, the header block and the payload. The rs1 block is
// "name: value\n" lines and is used whenever every header survives that
// form unchanged; the rs2 block holds length-prefixed names and values and
// carries any bytes.
//
// [Decode] is strict and never fails: a record that is not exactly a
// well-formed envelope is a plain payload, returned whole with no headers.
// [Encode] and [Decode] are pure functions and safe for concurrent use.
package envelope
