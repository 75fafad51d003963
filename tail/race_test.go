//go:build race

package tail

const raceEnabled = true
