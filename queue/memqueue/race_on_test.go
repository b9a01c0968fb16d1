//go:build race

package memqueue_test

// raceEnabled reports whether the race detector is on (it instruments every
// byte the record decoder reads, so the many-job tests run fewer jobs).
const raceEnabled = true
