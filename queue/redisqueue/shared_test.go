package redisqueue_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/pool/sharedtest"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// BackendLeases passes the conformance suite of backend leases and
// holder registries, each subtest on a prefix of its own.
func TestBackendLeasesConformance(t *testing.T) {
	sharedtest.RunBackendLeasesTests(t, sharedtest.LeasesHarness{
		NewBacking: func(t *testing.T, now func() time.Time) func() pool.BackendLeases {
			c := redistest.Client(t, 0)
			prefix := redistest.Prefix(t, c)
			return func() pool.BackendLeases {
				l, err := redisqueue.NewBackendLeases(c, &redisqueue.BackendLeasesConfig{Prefix: prefix, Test: redisqueue.BackendLeasesTestConfig{Now: now}})
				require.NoError(t, err)
				return l
			}
		},
	})
}

// Failover passes the conformance suite of shared failovers, each subtest
// on a prefix of its own.
func TestFailoverConformance(t *testing.T) {
	sharedtest.RunFailoverTests(t, func(t *testing.T) sharedtest.FailoverBacking {
		c := redistest.Client(t, 0)
		prefix := redistest.Prefix(t, c)
		return sharedtest.FailoverBacking{
			Open: func(t *testing.T, o sharedtest.FailoverOptions) sharedtest.Failover {
				f, err := redisqueue.NewFailover(t.Context(), c, &redisqueue.FailoverConfig{Prefix: prefix, Failover: &o.Failover,
					RefreshInterval: o.RefreshInterval, Logger: o.Logger})
				require.NoError(t, err)
				return f
			},
			BlockSilently: func(t *testing.T, k failover.Key) { blockSilently(t, c, prefix, k) },
			ClearSilently: func(t *testing.T, k failover.Key) {
				m := fmt.Sprintf("%d:%s%s", len(k.Backend), k.Backend, k.Workflow)
				require.NoError(t, c.HDel(t.Context(), "{"+prefix+"}:fo:pairs", m).Err())
				require.NoError(t, c.ZRem(t.Context(), "{"+prefix+"}:fo:until", m).Err())
			},
		}
	})
}

// testClock is a settable clock shared by the stores of one test.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *testClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// The keys as written: an Acquire forgets expired leases of other
// backends; the arguments the stores refuse.
func TestBackendLeasesKeys(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	clock := newTestClock()
	cfg := &redisqueue.BackendLeasesConfig{Prefix: redistest.Prefix(t, c), Test: redisqueue.BackendLeasesTestConfig{Now: clock.now}}
	leases, err := redisqueue.NewBackendLeases(c, cfg)
	require.NoError(t, err)
	ctx := t.Context()
	_, err = leases.Acquire(ctx, "gpu-0", "proc-a", time.Minute)
	require.NoError(t, err)
	_, err = leases.Acquire(ctx, "gpu-1", "proc-b", time.Second)
	require.NoError(t, err)
	clock.advance(2 * time.Second)
	_, err = leases.Acquire(ctx, "gpu-0", "proc-a", time.Minute)
	require.NoError(t, err)
	ns := "{" + cfg.Prefix + "}:bl:"
	names, err := c.HKeys(ctx, ns+"holder").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"gpu-0"}, names, "gpu-1's expired lease was forgotten")
	n, err := c.ZCard(ctx, ns+"expires").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)

	_, err = leases.Acquire(ctx, "gpu-x", "p", 0)
	assert.Error(t, err, "a ttl of zero")
	_, err = leases.Announce(ctx, "p", 0)
	assert.Error(t, err, "a ttl of zero")
	_, err = redisqueue.NewBackendLeases(nil, nil)
	assert.Error(t, err)
	_, err = redisqueue.NewFailover(ctx, nil, nil)
	assert.Error(t, err)
	_, err = redisqueue.NewFailover(ctx, c, &redisqueue.FailoverConfig{RefreshInterval: -1})
	assert.Error(t, err)
}

// The pair's state as written: failures counted, a block with its end
// and the blocks since the last success, a workflow fault not written, a
// success forgetting the pair.
func TestFailoverPairState(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 0)
	prefix := redistest.Prefix(t, c)
	p := newProcess(t, c, prefix, failover.Config{MaxFailuresBeforeBlock: 2, Cooldown: time.Hour}, foOpts{})
	p.f.RecordFailure(pairA, errBackend)
	assert.Equal(t, "1 0 0", pairState(t, c, prefix, pairA))
	p.f.RecordFailure(pairB, &comfy.ExecutionError{NodeID: "2"})
	assert.Empty(t, pairState(t, c, prefix, pairB), "a workflow fault is not written")
	p.f.RecordFailure(pairA, errBackend)
	ev := p.next(t)
	assert.Equal(t, fmt.Sprintf("0 1 %d", ev.Until.UnixMicro()), pairState(t, c, prefix, pairA))
	p.f.RecordSuccess(pairA)
	assert.Equal(t, failover.EventUnblocked, p.next(t).Kind)
	assert.Empty(t, pairState(t, c, prefix, pairA), "a success forgets the pair")
}
