package bench

import (
	"fmt"
	"slices"
	"time"
)

// Latency summarises a set of durations. The percentiles are nearest-rank:
// P99 is the smallest duration at least 99% of the set do not exceed.
type Latency struct {
	N                  int
	P50, P90, P99, Max time.Duration
}

// Summarize returns the Latency of ds, which it sorts. An empty ds gives
// the zero Latency.
func Summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	slices.Sort(ds)
	rank := func(p int) time.Duration { // nearest rank: ceil(p/100 * n), 1-based
		return ds[(p*len(ds)+99)/100-1]
	}
	return Latency{N: len(ds), P50: rank(50), P90: rank(90), P99: rank(99), Max: ds[len(ds)-1]}
}

// String formats l as "n=… p50=… p90=… p99=… max=…".
func (l Latency) String() string {
	return fmt.Sprintf("n=%d p50=%v p90=%v p99=%v max=%v", l.N, l.P50, l.P90, l.P99, l.Max)
}
