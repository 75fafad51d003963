//go:build !race

package tail

const raceEnabled = false
