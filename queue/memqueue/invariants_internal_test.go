package memqueue

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
)

// TestInvariantsUnderRandomOps drives every operation at random (lease
// expiry and retry delays on fake time) and checks after each step that
// the indexes, heaps, counts and symbol references agree with the
// records, and that every Job an operation returned is what its record
// decodes to (jobOf shares strings with the caller and builds from the
// record write left: see known); at the end, with every record purged, no
// symbol, index or body reference is left.
func TestInvariantsUnderRandomOps(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, err := New(&Config{Capacity: -1, MaxRetained: 50, Retention: time.Minute})
		require.NoError(t, err)
		q := queue.New(d)
		defer q.Close()
		ctx := t.Context()
		rng := rand.New(rand.NewPCG(3, 4))
		pick := func(s ...string) string { return s[rng.IntN(len(s))] }
		for _, k := range []string{"tpl-a", "tpl-b"} {
			require.NoError(t, q.PutWorkflow(ctx, k, []byte(k)))
		}
		var ids []string
		leased := map[string]*queue.Job{}
		// fresh checks that j, returned by an operation (or nil), is its
		// record as it is now, unless a prune dropped the record.
		fresh := func(j *queue.Job, err error) {
			t.Helper()
			if err != nil || j == nil {
				return
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if slot, err := d.find(j.ID); err == nil {
				require.Equal(t, d.toJob(slot), j)
			}
		}
		// anyCase returns s, or s in upper case (which parseID accepts).
		anyCase := func(s string) string {
			if rng.IntN(4) == 0 {
				return strings.ToUpper(s)
			}
			return s
		}
		for step := range 2000 {
			switch op := rng.IntN(16); op {
			case 0, 1, 2:
				p := queue.EnqueueParams{
					Priority: rng.IntN(3), Workflow: pick("", "w1", "w2"), WorkflowKey: pick("", "tpl-a", "tpl-b"),
					Requires: [][]string{nil, {"gpu"}, {"gpu", "sdxl"}}[rng.IntN(3)],
					Needs:    [][]string{nil, {"class:X"}, {"value:X/ckpt=a"}}[rng.IntN(3)],
					Metadata: map[string]string{"tenant": pick("t1", "t2"), pick("a", "b"): fmt.Sprint(step)},
					Payload:  []byte(fmt.Sprint(step)), Overrides: []byte("o"), MaxAttempts: 1 + rng.IntN(3),
					Settle: rng.IntN(2) == 0,
				}
				if rng.IntN(4) == 0 {
					p.IdempotencyKey = fmt.Sprint("k", rng.IntN(50))
				}
				j, err := q.Enqueue(ctx, p)
				fresh(j, err)
				if err == nil {
					ids = append(ids, j.ID)
				}
			case 3, 4:
				j, err := q.Lease(ctx, queue.LeaseParams{
					Backend: pick("b1", "b2", "b3"), Duration: time.Duration(1+rng.IntN(20)) * time.Second,
					Tags: []string{"gpu", "sdxl"}, Has: queue.NewCapabilities([]string{"class:X"}),
				})
				require.NoError(t, err)
				fresh(j, err)
				if j != nil {
					leased[j.ID] = j
				}
			case 5:
				for id, j := range leased {
					fresh(q.Begin(ctx, anyCase(id), anyCase(j.LeaseToken), queue.BeginParams{PromptID: fmt.Sprint("p", step), Backend: pick("", "b9")}))
					if rng.IntN(2) == 0 {
						fresh(q.Extend(ctx, anyCase(id), anyCase(j.LeaseToken), time.Duration(1+rng.IntN(20))*time.Second))
					}
					break
				}
			case 6:
				for id, j := range leased {
					fresh(q.Complete(ctx, anyCase(id), anyCase(j.LeaseToken), []byte("r")))
					delete(leased, id)
					break
				}
			case 7:
				for id, j := range leased {
					fresh(q.Fail(ctx, anyCase(id), j.LeaseToken, queue.FailParams{
						Error:      queue.ErrorSummary{Class: pick("backend", "workflow"), Message: "x", NodeID: "3", NodeType: pick("", "KSampler")},
						RetryAfter: time.Duration(rng.IntN(3)) * time.Second, ExcludeBackend: rng.IntN(2) == 0,
						Needs: [][]string{nil, {}, {"class:Y"}}[rng.IntN(3)],
					}))
					delete(leased, id)
					break
				}
			case 8:
				for id, j := range leased {
					fresh(q.RequeueWith(ctx, id, anyCase(j.LeaseToken), queue.RequeueParams{Error: queue.ErrorSummary{Class: "cancelled"}}))
					delete(leased, id)
					break
				}
			case 9:
				if len(ids) > 0 {
					fresh(q.Cancel(ctx, anyCase(ids[rng.IntN(len(ids))])))
				}
			case 10:
				if len(ids) > 0 {
					fresh(q.Retry(ctx, anyCase(ids[rng.IntN(len(ids))])))
				}
			case 11:
				_, err := q.Purge(ctx, queue.PurgeParams{Limit: rng.IntN(5)})
				require.NoError(t, err)
			case 12:
				time.Sleep(time.Duration(rng.IntN(5)) * time.Second)
				if len(ids) > 0 {
					j, err := q.Get(ctx, anyCase(ids[rng.IntN(len(ids))]))
					if err != nil {
						require.ErrorIs(t, err, queue.ErrNotFound)
					}
					fresh(j, err)
				}
			case 13:
				_, err := q.List(ctx, queue.ListParams{Metadata: map[string]string{"tenant": "t1"}, Limit: 5, Count: true})
				require.NoError(t, err)
			case 14:
				if len(ids) > 0 {
					j, err := q.Settle(ctx, anyCase(ids[rng.IntN(len(ids))]))
					if err != nil {
						require.ErrorIs(t, err, queue.ErrNotFound)
					}
					fresh(j, err)
				}
			case 15:
				js, err := q.ClaimUnsettled(ctx, time.Now().Add(-time.Duration(rng.IntN(3))*time.Second),
					time.Duration(1+rng.IntN(5))*time.Second, 1+rng.IntN(5))
				require.NoError(t, err)
				for _, j := range js {
					if rng.IntN(3) > 0 {
						_, err := q.Settle(ctx, j.ID)
						require.NoError(t, err)
					}
				}
			}
			require.NoError(t, d.checkInvariants(), "step %d", step)
		}
		// Drain: cancel everything unfinished, settle and purge everything
		// finished.
		for _, id := range ids {
			_, _ = q.Cancel(ctx, id)
			_, _ = q.Settle(ctx, id)
		}
		_, err = q.Purge(ctx, queue.PurgeParams{})
		require.NoError(t, err)
		require.NoError(t, d.checkInvariants())
		require.Zero(t, d.Len())
		require.Empty(t, d.syms.ids, "every symbol freed")
		require.Empty(t, d.byBackend)
		require.Empty(t, d.byMeta)
		require.Zero(t, d.all.len())
		// The Queue swept the bodies unreferenced for a Retention; a purge
		// takes the rest.
		_, err = q.PurgeWorkflows(ctx, time.Now().Add(time.Second))
		require.NoError(t, err)
		require.Empty(t, d.bodies)
	})
}
