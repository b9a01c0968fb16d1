//go:build race

package main

// raceEnabled reports whether the tests run with the race detector: the
// command they build gets it too.
const raceEnabled = true
