//go:build !unix

package memqueue_test

// readUsage is not measured on this system.
func readUsage() usage { return usage{} }
