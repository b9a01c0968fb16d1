package queuetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestQuantile(t *testing.T) {
	t.Parallel()
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	for _, c := range []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{[]time.Duration{7}, 0.50, 7},
		{[]time.Duration{7}, 0.99, 7},
		{[]time.Duration{1, 2, 3}, 0.50, 2},
		{[]time.Duration{1, 2, 3, 4}, 0.50, 2},
		{[]time.Duration{1, 2, 3}, 0.99, 3},
		{hundred, 0.50, 50},
		{hundred, 0.99, 99},
		{hundred, 0.991, 100},
		{hundred, 0, 1},
	} {
		assert.Equal(t, c.want, quantile(c.sorted, c.p), "p%v of %d values", c.p, len(c.sorted))
	}
}
