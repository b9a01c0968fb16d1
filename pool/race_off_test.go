//go:build !race

package pool_test

// raceEnabled reports whether the race detector is on (it slows the
// many-job tests about tenfold, so they run fewer jobs).
const raceEnabled = false
