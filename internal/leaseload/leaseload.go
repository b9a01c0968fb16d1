// Package leaseload holds the lessees of the queue drivers' lease
// benchmarks, which run both under go test -bench (queue/queuetest) and
// in comfypool bench (bench), so that the two measure the same loops.
package leaseload

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/comfypool/comfypool/queue"
)

// Drain runs lessees goroutines that lease, each with params(w) (w is the
// goroutine's number), and complete until nothing is left, and returns
// the number of jobs they completed. The i-th completion's time (its
// Lease plus its Complete, as the lessee saw it) goes to lat[i] when i <
// len(lat). The first error stops every lessee and is returned.
func Drain(ctx context.Context, q *queue.Queue, lessees int, params func(w int) queue.LeaseParams, lat []time.Duration) (int64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var done atomic.Int64
	var wg sync.WaitGroup
	for w := range lessees {
		lp := params(w)
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				j, err := q.Lease(ctx, lp)
				if err != nil {
					cancel(fmt.Errorf("lease: %w", err))
					return
				}
				if j == nil {
					return
				}
				if _, err := q.Complete(ctx, j.ID, j.LeaseToken, nil); err != nil {
					cancel(fmt.Errorf("complete %s: %w", j.ID, err))
					return
				}
				if i := done.Add(1) - 1; i < int64(len(lat)) {
					lat[i] = time.Since(start)
				}
			}
		})
	}
	wg.Wait()
	return done.Load(), context.Cause(ctx)
}

// Leased is a job the idle lessee of Idle leased, and when its Lease
// returned.
type Leased struct {
	ID string
	At time.Time
}

// Idle is the lessee of a pickup benchmark: it leases with p and
// completes until nothing is left, sends the jobs it got on got, calls
// idle, and waits for ready or tick (either may be nil) to lease again,
// until ctx ends (it then returns nil). It reports its jobs only once
// it waits, so that the next job enqueued finds it waiting. A failed
// Lease or Complete is returned.
func Idle(ctx context.Context, q *queue.Queue, p queue.LeaseParams, ready <-chan struct{}, tick <-chan time.Time, got chan<- Leased, idle func()) error {
	var pending []Leased
	for {
		// After a wake-up, lease until there is none (see queue.Notifier).
		for {
			j, err := q.Lease(ctx, p)
			if err != nil {
				return ignoreEnd(ctx, fmt.Errorf("lease: %w", err))
			}
			if j == nil {
				break
			}
			at := time.Now()
			if _, err := q.Complete(ctx, j.ID, j.LeaseToken, nil); err != nil {
				return ignoreEnd(ctx, fmt.Errorf("complete %s: %w", j.ID, err))
			}
			pending = append(pending, Leased{j.ID, at})
		}
		for _, l := range pending {
			select {
			case got <- l:
			case <-ctx.Done():
				return nil
			}
		}
		pending = pending[:0]
		idle()
		select {
		case <-ready:
		case <-tick:
		case <-ctx.Done():
			return nil
		}
	}
}

// ignoreEnd returns nil when ctx ended (the failure is the end's), else
// err.
func ignoreEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
