package memqueue

// For the benchmarks of package memqueue_test.
type Usage = usage

// ReadUsage is readUsage.
var ReadUsage = readUsage
