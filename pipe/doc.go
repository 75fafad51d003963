// Package pipe implements the line codec of the SeaStreamer stdio format, the
// text format that streamd reads and writes when it runs as a stage in a Unix
// pipeline next to programs built on the Rust crate sea-streamer-stdio.
//
// The contract is spec/stdio-format.md; the vectors in testdata/stdio are the
// executable form of it. This package converts between single lines and
// message fields, and reads a stage's input lines ([Reader]) and writes its
// output lines ([Writer]). Routing lines to subscriptions belongs to the
// stage that uses it.
//
// # Line format
//
// Every message is one line of UTF-8 text, optionally preceded by a header
// in square brackets:
//
//	[timestamp | stream key | sequence | shard id] payload
//
// The header carries one to four parts, and only these combinations are
// valid: timestamp; timestamp and stream key; timestamp, stream key and
// sequence; all four; stream key; stream key and sequence; stream key,
// sequence and shard id. A line has a header if and only if its first byte is
// '[' and a ']' follows after at least one other character. A line that has a
// header with an invalid part is rejected, not demoted to a plain payload, so
// a line such as `["a", "b"]` is an error. Lines without a header are
// payloads, byte for byte.
//
// # Parsing
//
// [ParseLine] parses one line whose trailing '\n' the caller has removed. A
// '\r' before it is part of the line and usually ends up in the payload, as
// it does in Rust. ParseLine does not allocate for a line it accepts:
// [Line.StreamKey] and [Line.Payload] alias the input, so a caller that
// reuses its read buffer must copy them first. A rejected line yields a
// [*LineError] naming the offending header part, or an error matching
// [ErrInvalidUTF8]; the caller adds the line number. The Rust consumer aborts
// the whole process on the first such line, and a drop-in replacement must at
// least neither deliver the line nor turn it into a payload.
//
// Timestamps follow the Rust time crate exactly: a four-digit year with an
// optional sign, two-digit month, day, hour, minute and second, an uppercase
// 'T', no zone, and an optional fraction of 1 to 32 digits, of which the first
// nine give the nanoseconds and the rest are ignored. The limit of 32 is that
// of current time 0.3 releases, which leave the 33rd digit unconsumed and so
// reject the part. Older releases accepted any number of digits; ParseLine
// rejects a part with more than 32, like the current releases. Timestamps are
// UTC.
//
// # Sequence numbers
//
// A [Sequencer] fills in what a line leaves out the way the Rust consumer
// does: the stream key defaults to [BroadcastKey], the shard id to 0, and the
// sequence comes from one counter per stream key and shard. A line with
// sequence N sets that counter to N, not N+1, so the next line without a
// sequence also gets N.
//
// # Formatting
//
// [AppendProducerLine] and [Producer] write what the Rust stdio producer
// prints: a three-part header with a whole-second timestamp, the producer's
// own per-key sequence and the payload verbatim. [AppendLogLine] writes the
// four-part form of `ss-decode --format log`, which preserves timestamp,
// stream key, sequence and shard id. None of them escapes anything. A
// payload that is empty, starts with whitespace or contains '\n' does not
// come back unchanged from a downstream parser; the callers decide what to do
// about that.
package pipe
