package handler

import (
	"bytes"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The environment of the exec handler's command carries, besides the
// daemon's own (without its record header variables, see execBaseEnv) and
// the configured env, the delivery's metadata (see deliveryMeta) and the
// record headers.
const (
	// execHeaderEnvPrefix carries a record header whose value is valid
	// UTF-8 without NUL, as is. The name follows the prefix in upper case,
	// each byte other than A-Z and 0-9 written '_': content-type becomes
	// STREAMD_HEADER_CONTENT_TYPE.
	execHeaderEnvPrefix = "STREAMD_HEADER_"
	// execBase64HeaderEnvPrefix carries any other record header value, in
	// standard base64 with padding, its name written as above.
	execBase64HeaderEnvPrefix = "STREAMD_BASE64_HEADER_"
	// execPayloadLengthEnv carries the payload's length in bytes, so that a
	// command can check it read the whole payload from stdin.
	execPayloadLengthEnv = "STREAMD_PAYLOAD_LENGTH"
)

// execBaseEnv is the environment every command of an exec handler starts
// from: the daemon's own, then the configured env in name order, so that a
// configured variable wins over an inherited one. Inherited record header
// variables are left out: a daemon run by another streamd's exec handler
// (chained stages) has those of the outer record, which a record without
// such a header must not seem to carry. The configured env may set them.
func execBaseEnv(env map[string]string) []string {
	base := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, execHeaderEnvPrefix) || strings.HasPrefix(kv, execBase64HeaderEnvPrefix)
	})
	for _, name := range slices.Sorted(maps.Keys(env)) {
		base = append(base, name+"="+env[name])
	}
	return base
}

// environ is the command's environment for d.
func (h *execHandler) environ(d *Delivery) []string {
	env := make([]string, 0, len(h.env)+len(d.Headers)+len(deliveryMeta)+1) // +1: the payload's length
	env = append(env, h.env...)
	for _, e := range d.Headers {
		if utf8.Valid(e.Value) && bytes.IndexByte(e.Value, 0) < 0 {
			env = append(env, execHeaderEnvPrefix+envName(e.Name)+"="+string(e.Value))
		} else {
			env = append(env, execBase64HeaderEnvPrefix+envName(e.Name)+"="+base64Value(e.Value))
		}
	}
	for _, m := range deliveryMeta {
		env = append(env, m.env+"="+m.value(d))
	}
	// A command killed or cut off mid-read can tell a short payload.
	env = append(env, string(strconv.AppendInt([]byte(execPayloadLengthEnv+"="), int64(len(d.Payload)), 10)))
	return env
}

// envName writes a header name as a variable name: upper case, each byte
// other than A-Z and 0-9 replaced by '_'.
func envName(name string) string {
	b := []byte(name)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - ('a' - 'A')
		case 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}

// maxEnvString is the longest argument or environment string, with its
// NUL, that Linux passes to a command (MAX_ARG_STRLEN: 32 pages).
const maxEnvString = 32 * 4096

// recordTooLarge tells, for the arguments and environment env that exec
// refused as too large (E2BIG), env's first base variables the handler's
// own, whether the record's variables are why: one longer than Linux
// takes, or, all together, more than the arguments and the rest of the
// environment. It returns the longest of them, by name, and its length.
func recordTooLarge(args, env []string, base int) (name string, size int, ok bool) {
	rest, record := 0, 0
	for _, a := range args {
		rest += len(a) + 1
	}
	for i, kv := range env {
		if i < base {
			rest += len(kv) + 1
			continue
		}
		record += len(kv) + 1
		if len(kv)+1 > size {
			name, _, _ = strings.Cut(kv, "=")
			size = len(kv) + 1
		}
	}
	return name, size, size > maxEnvString || record > rest
}
