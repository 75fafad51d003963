package pipe

import (
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

const (
	// BroadcastKey is the stream key of a line that gives none. A line that
	// names it explicitly is an ordinary line of that stream.
	BroadcastKey = "broadcast"

	// MaxStreamKeyLen is the maximum length of a stream key in bytes (and,
	// since stream keys are ASCII, in characters).
	MaxStreamKeyLen = 249

	// maxFractionDigits is the number of fraction digits the current time
	// crate consumes; a longer fraction leaves digits unconsumed, which
	// fails the whole part.
	maxFractionDigits = 32
)

// tsFields describes the fixed-width fields of a timestamp: each is followed
// by sep (0 for the last), and its failure reasons are constants so that
// parseTimestamp never allocates.
var tsFields = [...]struct {
	width     int
	sep       byte
	badDigits string
	badSep    string
}{
	{4, '-', "year must be 4 digits", "expected '-' after the year"},
	{2, '-', "month must be 2 digits", "expected '-' after the month"},
	{2, 'T', "day must be 2 digits", "expected 'T' after the date"},
	{2, ':', "hour must be 2 digits", "expected ':' after the hour"},
	{2, ':', "minute must be 2 digits", "expected ':' after the minute"},
	{2, 0, "second must be 2 digits", ""},
}

// parseTimestamp parses a timestamp part as the Rust time crate does with
// "[year]-[month]-[day]T[hour]:[minute]:[second]" and the same followed by
// ".[subsecond]". It returns the time in UTC, or a non-empty reason.
func parseTimestamp(s []byte) (time.Time, string) {
	i := 0
	negative := false
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		negative = s[0] == '-'
		i = 1
	}
	var v [len(tsFields)]int
	for k, f := range tsFields {
		n, ok := fixedDigits(s, i, f.width)
		if !ok {
			return time.Time{}, f.badDigits
		}
		v[k] = n
		i += f.width
		if f.sep == 0 {
			break
		}
		if i >= len(s) || s[i] != f.sep {
			return time.Time{}, f.badSep
		}
		i++
	}
	nanos := 0
	if i < len(s) && s[i] == '.' {
		i++
		digits := 0
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			if digits < 9 {
				nanos = nanos*10 + int(s[i]-'0')
			}
			digits++
			i++
		}
		switch {
		case digits == 0:
			return time.Time{}, "fraction needs at least one digit"
		case digits > maxFractionDigits:
			return time.Time{}, "more than 32 fraction digits"
		}
		for ; digits < 9; digits++ {
			nanos *= 10
		}
	}
	if i != len(s) {
		return time.Time{}, "unexpected text after the time"
	}
	year, month, day, hour, minute, second := v[0], v[1], v[2], v[3], v[4], v[5]
	if negative {
		year = -year
	}
	switch {
	case month < 1 || month > 12:
		return time.Time{}, "month out of range"
	case day < 1 || day > daysIn(year, month):
		return time.Time{}, "day out of range for the month"
	case hour > 23:
		return time.Time{}, "hour out of range"
	case minute > 59:
		return time.Time{}, "minute out of range"
	case second > 59:
		return time.Time{}, "second out of range"
	}
	return time.Date(year, time.Month(month), day, hour, minute, second, nanos, time.UTC), ""
}

// fixedDigits returns the value of the n ASCII digits at s[i:], or false if
// there are fewer than n.
func fixedDigits(s []byte, i, n int) (int, bool) {
	if i+n > len(s) {
		return 0, false
	}
	v := 0
	for _, c := range s[i : i+n] {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

// daysIn returns the number of days of month in year of the proleptic
// Gregorian calendar, for negative years too.
func daysIn(year, month int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	default:
		return 31
	}
}

// isStreamKeyChar reports whether c may occur in a stream key.
func isStreamKeyChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// validStreamKey reports whether s is a stream key: 1 to [MaxStreamKeyLen]
// characters from [A-Za-z0-9._-].
func validStreamKey[T string | []byte](s T) bool {
	if len(s) == 0 || len(s) > MaxStreamKeyLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isStreamKeyChar(s[i]) {
			return false
		}
	}
	return true
}

// streamKeyReason explains why s is not a stream key.
func streamKeyReason[T string | []byte](s T) string {
	for i := 0; i < len(s); {
		if isStreamKeyChar(s[i]) {
			i++
			continue
		}
		r, _ := utf8.DecodeRuneInString(string(s[i:]))
		return fmt.Sprintf("character %q is not allowed", r)
	}
	if len(s) == 0 {
		return "empty"
	}
	return fmt.Sprintf("%d characters, longer than %d", len(s), MaxStreamKeyLen)
}

// parseUint64 parses a part as Rust's u64::from_str does: an optional '+'
// and one or more ASCII digits, leading zeros allowed, no overflow. It
// returns a non-empty reason if s is not such a number.
func parseUint64(s []byte) (uint64, string) {
	if len(s) > 0 && s[0] == '+' {
		s = s[1:]
	}
	if len(s) == 0 {
		return 0, "no digits"
	}
	var n uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, "not an unsigned decimal integer"
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, "larger than 18446744073709551615"
		}
		n = n*10 + d
	}
	return n, ""
}
