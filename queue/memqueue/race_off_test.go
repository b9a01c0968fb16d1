//go:build !race

package memqueue_test

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
