package failover_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/failover"
)

var (
	keyA = failover.Key{Backend: "gpu-a", Workflow: "wf1"}
	keyB = failover.Key{Backend: "gpu-b", Workflow: "wf1"}

	errBackend  = &comfy.HTTPError{Method: http.MethodPost, Path: "/prompt", StatusCode: 502}
	errWorkflow = &comfy.ExecutionError{NodeID: "2", NodeType: "ImageToMask", ExceptionType: "IndexError"}
)

// recorder collects events; safe for the timer goroutine.
type recorder struct {
	mu     sync.Mutex
	events []failover.Event
	at     []time.Time
}

func (r *recorder) record(ev failover.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	r.at = append(r.at, time.Now())
}

func (r *recorder) snapshot() ([]failover.Event, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]failover.Event(nil), r.events...), append([]time.Time(nil), r.at...)
}

func newFailover(t *testing.T, cfg failover.Config) (*failover.SmartFailover, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg.OnEvent = rec.record
	f, err := failover.New(&cfg)
	require.NoError(t, err)
	t.Cleanup(f.Close)
	return f, rec
}

func TestBlockThenUnblockWhenCooldownEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, rec := newFailover(t, failover.Config{})
		start := time.Now()

		assert.Equal(t, failover.ClassBackend, f.RecordFailure(keyA, errBackend))
		assert.False(t, f.Allowed(keyA), "one backend failure blocks the pair by default")
		assert.True(t, f.Allowed(keyB), "other backends are not affected")
		assert.True(t, f.Allowed(failover.Key{Backend: "gpu-a", Workflow: "wf2"}), "other workflows on the same backend are not affected")
		until, blocked := f.BlockedUntil(keyA)
		require.True(t, blocked)
		assert.Equal(t, start.Add(60*time.Second), until)

		// Nothing else happens: the unblock must come from the cooldown
		// itself, at its end.
		time.Sleep(61 * time.Second)
		synctest.Wait()
		events, at := rec.snapshot()
		require.Len(t, events, 2)
		assert.Equal(t, failover.EventBlocked, events[0].Kind)
		assert.Equal(t, keyA, events[0].Key)
		assert.Equal(t, 1, events[0].Failures)
		assert.ErrorIs(t, events[0].Err, errBackend)
		assert.Equal(t, failover.EventUnblocked, events[1].Kind)
		assert.Equal(t, keyA, events[1].Key)
		assert.Equal(t, start.Add(60*time.Second), at[1], "unblock is emitted when the cooldown ends")
		assert.True(t, f.Allowed(keyA))
	})
}

func TestMaxFailuresBeforeBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, rec := newFailover(t, failover.Config{MaxFailuresBeforeBlock: 3, Cooldown: 10 * time.Second})
		f.RecordFailure(keyA, errBackend)
		f.RecordFailure(keyA, errBackend)
		assert.True(t, f.Allowed(keyA), "two of three failures do not block")
		f.RecordSuccess(keyA)
		f.RecordFailure(keyA, errBackend)
		f.RecordFailure(keyA, errBackend)
		assert.True(t, f.Allowed(keyA), "a success resets the count")
		f.RecordFailure(keyA, errBackend)
		assert.False(t, f.Allowed(keyA))
		events, _ := rec.snapshot()
		require.Len(t, events, 1)
		assert.Equal(t, 3, events[0].Failures)
	})
}

func TestWorkflowFaultsCancelsAndTransientsBlockNobody(t *testing.T) {
	f, rec := newFailover(t, failover.Config{})
	for _, tc := range []struct {
		err  error
		want failover.Class
	}{
		{errWorkflow, failover.ClassWorkflow},
		{&comfy.PromptError{StatusCode: 400, Err: comfy.ErrorDetail{Type: "prompt_outputs_failed_validation"}}, failover.ClassWorkflow},
		{context.Canceled, failover.ClassCancelled},
		{fmt.Errorf("run: %w", comfy.ErrInterrupted), failover.ClassCancelled},
		{fmt.Errorf("run: %w", comfy.ErrPromptRemoved), failover.ClassTransient},
	} {
		assert.Equal(t, tc.want, f.RecordFailure(keyA, tc.err), "%v", tc.err)
	}
	assert.True(t, f.Allowed(keyA))
	events, _ := rec.snapshot()
	assert.Empty(t, events)
}

func TestCooldownGrowsAndIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := newFailover(t, failover.Config{Cooldown: 10 * time.Second, CooldownGrowth: 2, MaxCooldown: 30 * time.Second})
		var got []time.Duration
		for range 4 {
			start := time.Now()
			f.RecordFailure(keyA, errBackend)
			until, ok := f.BlockedUntil(keyA)
			require.True(t, ok)
			got = append(got, until.Sub(start))
			time.Sleep(until.Sub(start))
			synctest.Wait()
		}
		assert.Equal(t, []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second, 30 * time.Second}, got)
		f.RecordSuccess(keyA)
		start := time.Now()
		f.RecordFailure(keyA, errBackend)
		until, _ := f.BlockedUntil(keyA)
		assert.Equal(t, 10*time.Second, until.Sub(start), "a success resets the growth")
	})
}

func TestUnblocksInOrderAcrossPairs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, rec := newFailover(t, failover.Config{Cooldown: 30 * time.Second})
		start := time.Now()
		f.RecordFailure(keyA, errBackend)
		time.Sleep(10 * time.Second)
		f.RecordFailure(keyB, errBackend)
		time.Sleep(time.Minute)
		synctest.Wait()
		events, at := rec.snapshot()
		require.Len(t, events, 4)
		assert.Equal(t, failover.EventUnblocked, events[2].Kind)
		assert.Equal(t, keyA, events[2].Key)
		assert.Equal(t, start.Add(30*time.Second), at[2])
		assert.Equal(t, keyB, events[3].Key)
		assert.Equal(t, start.Add(40*time.Second), at[3])
		assert.Empty(t, f.Blocked())
	})
}

func TestSuccessWhileBlockedUnblocks(t *testing.T) {
	f, rec := newFailover(t, failover.Config{})
	f.RecordFailure(keyA, errBackend)
	require.Contains(t, f.Blocked(), keyA)
	f.RecordSuccess(keyA) // a run that started before the block succeeded
	assert.True(t, f.Allowed(keyA))
	events, _ := rec.snapshot()
	require.Len(t, events, 2)
	assert.Equal(t, failover.EventUnblocked, events[1].Kind)
}

func TestCloseStopsTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, rec := newFailover(t, failover.Config{})
		f.RecordFailure(keyA, errBackend)
		f.Close()
		f.Close() // idempotent
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		events, _ := rec.snapshot()
		assert.Len(t, events, 1, "no unblock after Close")
	})
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		cfg  failover.Config
		want string
	}{
		{failover.Config{MaxFailuresBeforeBlock: -1}, "MaxFailuresBeforeBlock"},
		{failover.Config{Cooldown: -time.Second}, "Cooldown"},
		{failover.Config{CooldownGrowth: 0.5}, "CooldownGrowth"},
		{failover.Config{Cooldown: time.Minute, MaxCooldown: time.Second}, "MaxCooldown"},
	} {
		_, err := failover.New(&tc.cfg)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
	cfg := failover.Config{}
	_, err := failover.New(&cfg)
	require.NoError(t, err)
	assert.Zero(t, cfg.Cooldown, "New does not modify the caller's Config")
}

func TestConcurrentUse(t *testing.T) {
	f, _ := newFailover(t, failover.Config{Cooldown: time.Millisecond})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			k := failover.Key{Backend: fmt.Sprint("gpu-", i%3), Workflow: "wf"}
			for range 200 {
				f.RecordFailure(k, errBackend)
				f.Allowed(k)
				f.RecordSuccess(k)
				f.Blocked()
			}
		})
	}
	wg.Wait()
}
