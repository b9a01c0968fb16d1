package redisqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/dag/storetest"
	"github.com/comfypool/comfypool/internal/dagtest"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// newDAGStore returns a DAGStore on c under prefix.
func newDAGStore(t testing.TB, c redis.UniversalClient, prefix string, now func() time.Time) *redisqueue.DAGStore {
	t.Helper()
	s, err := redisqueue.NewDAGStore(c, &redisqueue.DAGStoreConfig{Prefix: prefix, Test: redisqueue.DAGStoreTestConfig{Now: now}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// scriptsTwice is a go-redis hook that runs every script twice and
// returns the second run's answer: what a retry of go-redis does when a
// connection breaks after the server ran the script but before its
// answer came back. It counts the scripts it doubled.
type scriptsTwice struct{ doubled atomic.Int64 }

func (h *scriptsTwice) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptsTwice) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil {
			return err // NOSCRIPT: go-redis runs EVAL next
		}
		h.doubled.Add(1)
		cmd.SetErr(nil)
		return next(ctx, cmd)
	}
}

func (h *scriptsTwice) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestDAGStoreConformance(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 8)
	storetest.RunStoreTests(t, func(t *testing.T) dag.Store { return newDAGStore(t, c, redistest.Prefix(t, c), nil) })
}

func TestDAGStoreLeases(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 8)
	storetest.RunLeaseTests(t, func(t *testing.T) storetest.LeaseFixture {
		clock := storetest.NewClock(time.Date(2026, 11, 24, 1, 2, 3, 4000, time.UTC))
		return storetest.LeaseFixture{Store: newDAGStore(t, c, redistest.Prefix(t, c), clock.Now), Advance: clock.Advance}
	})
}

// Every script may run twice, as after a retry of go-redis, and the
// store still passes both suites: a CreateExecution that ran twice
// succeeds, and so on.
func TestDAGStoreScriptsRunTwice(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 8)
	h := &scriptsTwice{}
	c.AddHook(h)
	t.Run("Store", func(t *testing.T) {
		t.Parallel()
		storetest.RunStoreTests(t, func(t *testing.T) dag.Store { return newDAGStore(t, c, redistest.Prefix(t, c), nil) })
	})
	t.Run("Leases", func(t *testing.T) {
		t.Parallel()
		storetest.RunLeaseTests(t, func(t *testing.T) storetest.LeaseFixture {
			clock := storetest.NewClock(time.Date(2026, 11, 24, 1, 2, 3, 4000, time.UTC))
			return storetest.LeaseFixture{Store: newDAGStore(t, c, redistest.Prefix(t, c), clock.Now), Advance: clock.Advance}
		})
	})
	t.Cleanup(func() {
		if h.doubled.Load() == 0 {
			t.Error("no script ran twice")
		}
	})
}

// Stores in several processes share one prefix: their leases expire by
// the server's clock, one Executor takes over what a stalled process
// left, only the unfinished nodes run again, and a hand-over frees the
// lease at once.
func TestDAGStoreShared(t *testing.T) {
	t.Parallel()
	setup := redistest.Client(t, 2)
	dagtest.RunSharedStoreTests(t, func(t *testing.T) dagtest.Fixture {
		prefix := redistest.Prefix(t, setup)
		admin := newDAGStore(t, setup, prefix, nil)
		return dagtest.Fixture{
			NewStore: func(t *testing.T, now func() time.Time) dag.LeaseStore {
				return newDAGStore(t, redistest.Client(t, 4), prefix, now) // a process's own connections
			},
			LeaseOwner: func(t *testing.T, id string) string {
				owner, err := setup.HGet(t.Context(), admin.ExecKey(id), "owner").Result()
				if errors.Is(err, redis.Nil) {
					return ""
				}
				if err != nil {
					t.Fatal(err)
				}
				return owner
			},
			Now: func(t *testing.T) time.Time {
				now, err := setup.Time(t.Context()).Result()
				if err != nil {
					t.Fatal(err)
				}
				return now
			},
		}
	})
}

// Every key is under "{prefix}:dag:", Abandoned reads one sorted set of
// the running executions, and Delete leaves nothing of an execution.
func TestDAGStoreKeys(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 2)
	prefix := redistest.Prefix(t, c)
	s := newDAGStore(t, c, prefix, nil)
	ctx := t.Context()
	if got, want := s.KeyPrefix(), "{"+prefix+"}:dag:"; got != want {
		t.Fatalf("keys under %q, want %q", got, want)
	}
	rec := func(id string, st dag.Status) *dag.ExecutionRecord {
		return &dag.ExecutionRecord{ID: id, Status: st, Graph: json.RawMessage(`{}`), Created: time.Now(), Updated: time.Now()}
	}
	if err := s.CreateExecutionLeased(ctx, rec("run", dag.StatusRunning), dag.Lease{Owner: "a", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateExecution(ctx, rec("done", dag.StatusCompleted)); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveNodesLeased(ctx, "run", "a", []*dag.NodeRecord{{Node: "n", State: dag.NodeRunning}}); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveNode(ctx, "done", &dag.NodeRecord{Node: "n", State: dag.NodeCompleted}); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveMemo(ctx, "k", json.RawMessage(`1`)); err != nil {
		t.Fatal(err)
	}
	keys := func() []string {
		t.Helper()
		ks, err := c.Keys(ctx, "*"+prefix+"*").Result() // a scratch prefix: few keys, wherever they are
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(ks)
		return ks
	}
	p := s.KeyPrefix()
	if got, want := keys(), []string{p + "e:done", p + "e:run", p + "m:k", p + "n:done", p + "n:run", p + "running"}; !slices.Equal(got, want) {
		t.Fatalf("keys %q, want %q", got, want)
	}
	if n, err := c.ZCard(ctx, p+"running").Result(); err != nil || n != 1 {
		t.Fatalf("running set has %d members (%v), want 1 (the running execution)", n, err)
	}
	for _, id := range []string{"run", "done"} {
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := keys(), []string{p + "m:k"}; !slices.Equal(got, want) {
		t.Fatalf("keys after Delete %q, want %q", got, want)
	}
}

// A batch of many node records is one script call, even past what Lua
// unpacks at once.
func TestDAGStoreSaveNodesLargeBatch(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t, 2)
	s := newDAGStore(t, c, redistest.Prefix(t, c), nil)
	ctx := t.Context()
	rec := &dag.ExecutionRecord{ID: "e", Status: dag.StatusRunning, Created: time.Now(), Updated: time.Now()}
	if err := s.CreateExecutionLeased(ctx, rec, dag.Lease{Owner: "a", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	recs := make([]*dag.NodeRecord, 5000)
	for k := range recs {
		recs[k] = &dag.NodeRecord{Node: fmt.Sprint("n", k), State: dag.NodeCompleted, Runs: k}
	}
	if err := s.SaveNodesLeased(ctx, "e", "b", recs); !errors.Is(err, dag.ErrLeaseLost) {
		t.Fatalf("SaveNodesLeased by another owner: %v, want ErrLeaseLost", err)
	}
	if err := s.SaveNodesLeased(ctx, "e", "a", recs); err != nil {
		t.Fatal(err)
	}
	cp, err := s.Load(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	if len(cp.Nodes) != len(recs) || cp.Nodes["n4999"] == nil || cp.Nodes["n4999"].Runs != 4999 {
		t.Fatalf("%d nodes saved, want %d", len(cp.Nodes), len(recs))
	}
}

// A server that cannot be reached gives errors marked retryable, with
// the package's prefix.
func TestDAGStoreErrorsOfAnUnreachableServer(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	s := newDAGStore(t, c, "unreachable", nil)
	_, err := s.Load(t.Context(), "e")
	if err == nil || !queue.IsRetryable(err) || !strings.HasPrefix(err.Error(), `redisqueue: dag: load execution "e": `) {
		t.Fatalf("Load from a closed port: %v (retryable %v), want a retryable redisqueue: dag: error", err, queue.IsRetryable(err))
	}
	err = s.SaveNodesLeased(t.Context(), "e", "a", nil)
	if err == nil || !queue.IsRetryable(err) || errors.Is(err, dag.ErrLeaseLost) {
		t.Fatalf("SaveNodesLeased to a closed port: %v, want a retryable error", err)
	}
}

func TestNewDAGStore(t *testing.T) {
	t.Parallel()
	if _, err := redisqueue.NewDAGStore(nil, nil); err == nil {
		t.Fatal("NewDAGStore(nil) = nil error")
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisqueue.NewDAGStore(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.KeyPrefix(), "{comfypool}:dag:"; got != want {
		t.Errorf("default keys under %q, want %q", got, want)
	}
	for _, p := range []string{"a{b", "a}b"} {
		if _, err := redisqueue.NewDAGStore(c, &redisqueue.DAGStoreConfig{Prefix: p}); err == nil || !strings.Contains(err.Error(), "Prefix") {
			t.Errorf("NewDAGStore with Prefix %q: %v, want an error naming Prefix", p, err)
		}
	}
}

// BenchmarkDAGStoreSaveNodes measures a checkpoint write of the Executor:
// a group of node records under the execution's lease, one script.
func BenchmarkDAGStoreSaveNodes(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprint("records=", n), func(b *testing.B) {
			c := redistest.Client(b, 2)
			s := newDAGStore(b, c, redistest.Prefix(b, c), nil)
			rec := &dag.ExecutionRecord{ID: "e", Status: dag.StatusRunning, Graph: []byte(`{}`), Created: time.Now(), Updated: time.Now()}
			if err := s.CreateExecutionLeased(b.Context(), rec, dag.Lease{Owner: "me", TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
			recs := make([]*dag.NodeRecord, n)
			for k := range recs {
				recs[k] = &dag.NodeRecord{Node: fmt.Sprint("n", k), State: dag.NodeCompleted, Runs: 1,
					Outputs: []byte(`{"text":"some output"}`), Started: time.Now(), Ended: time.Now()}
			}
			b.ResetTimer()
			for b.Loop() {
				if err := s.SaveNodesLeased(b.Context(), "e", "me", recs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
