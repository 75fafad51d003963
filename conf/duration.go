package conf

import (
	"fmt"
	"time"
)

// Duration is a length of time written in the configuration as a string
// with a unit, as [time.ParseDuration] reads it: "250ms", "5s", "2m",
// "1h30m". A bare integer is an error, not nanoseconds.
type Duration time.Duration

// UnmarshalText parses a duration such as "5s".
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("invalid duration %q: write a number with a unit, as in \"5s\" or \"2m\"", text)
	}
	*d = Duration(v)
	return nil
}

// String returns the duration as [time.Duration.String] writes it.
func (d Duration) String() string { return time.Duration(d).String() }
