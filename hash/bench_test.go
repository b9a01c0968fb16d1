package hash

import (
	"fmt"
	"testing"
)

func benchmarkHash(b *testing.B, fn func([]byte) (Sum, error)) {
	for _, n := range []int{10, 300} {
		w := genWorkflow(n)
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(w)))
			for b.Loop() {
				if _, err := fn(w); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkStructure(b *testing.B) { benchmarkHash(b, Structure) }

func BenchmarkExact(b *testing.B) { benchmarkHash(b, Exact) }
