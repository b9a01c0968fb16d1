package killtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/comfypool/comfypool/dag"
	"github.com/comfypool/comfypool/internal/leakcheck"
	"github.com/comfypool/comfypool/pool"
	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/memqueue"
)

// TestMain fails the run when a goroutine of the package outlives the
// tests.
func TestMain(m *testing.M) {
	leakcheck.Main(m, "comfypool/internal/killtest", "comfypool/queue/memqueue")
}

// TestHeldPrompts: only leased jobs whose open attempt's prompt a backend
// received, on a backend the holder holds, count; the listing follows
// its pages.
func TestHeldPrompts(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	drv, err := memqueue.New(&memqueue.Config{Capacity: -1})
	if err != nil {
		t.Fatal(err)
	}
	q := queue.New(drv)
	t.Cleanup(func() { _ = q.Close() })
	leases := &pool.MemoryBackendLeases{}
	for backend, holder := range map[string]string{"gpu-0": victimName, "gpu-1": "p2"} {
		if _, err := leases.Acquire(ctx, backend, holder, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// lease leases a new job on backend and, unless prompt is "", begins
	// an attempt with it.
	lease := func(backend, prompt string) *queue.Job {
		t.Helper()
		if _, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "w", MaxAttempts: 3}); err != nil {
			t.Fatal(err)
		}
		j, err := q.Lease(ctx, queue.LeaseParams{Backend: backend, Duration: time.Hour})
		if err != nil || j == nil {
			t.Fatalf("lease on %s: %v, %v", backend, j, err)
		}
		if prompt != "" {
			if j, err = q.Begin(ctx, j.ID, j.LeaseToken, queue.BeginParams{PromptID: prompt}); err != nil {
				t.Fatal(err)
			}
		}
		return j
	}
	want := map[string]string{}
	// More than a page of the victim's submitted prompts.
	for i := range queue.MaxListLimit + 5 {
		p := fmt.Sprint("held-", i)
		want[lease("gpu-0", p).ID] = p
	}
	lease("gpu-0", "unreceived")   // not on a backend yet
	lease("gpu-0", "")             // no attempt written down
	lease("gpu-1", "other-holder") // another holder's backend
	lease("gpu-2", "free-backend") // nobody's backend
	done := lease("gpu-0", "completed")
	if _, err := q.Complete(ctx, done.ID, done.LeaseToken, nil); err != nil {
		t.Fatal(err)
	}
	received := func(p string) bool { return p != "unreceived" }

	got, err := heldPrompts(ctx, q, leases, victimName, received)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		var extra []string
		for id, p := range got {
			if want[id] != p {
				extra = append(extra, p)
			}
		}
		t.Errorf("heldPrompts: %d jobs (unexpected prompts %v), want %d", len(got), extra, len(want))
	}
}

// TestCheckLedger: a job passes with exactly one consume and no refund,
// or with two consumes when it ended before the kill (the victim died
// between its hook and the settle mark); never with none.
func TestCheckLedger(t *testing.T) {
	t.Parallel()
	ledger := map[string]map[string]int{
		"ok":                {kindConsume: 1},
		"twice-by-victim":   {kindConsume: 2},
		"twice-after-kill":  {kindConsume: 2},
		"thrice-by-victim":  {kindConsume: 3},
		"refunded":          {kindRefund: 1},
		"both":              {kindConsume: 1, kindRefund: 1},
		"unsettled-victims": nil,
	}
	before := map[string]bool{"twice-by-victim": true, "thrice-by-victim": true, "unsettled-victims": true}
	ids := []string{"ok", "twice-by-victim", "twice-after-kill", "thrice-by-victim", "refunded", "both", "unsettled-victims"}
	again, problems := checkLedger(ids, ledger, func(id string) bool { return before[id] })
	if !slices.Equal(again, []string{"twice-by-victim"}) {
		t.Errorf("again = %v, want [twice-by-victim]", again)
	}
	var bad []string
	for _, p := range problems {
		id, _, _ := strings.Cut(strings.TrimPrefix(p, "job "), ":")
		bad = append(bad, id)
	}
	if want := []string{"twice-after-kill", "thrice-by-victim", "refunded", "both", "unsettled-victims"}; !slices.Equal(bad, want) {
		t.Errorf("problems %q, want one each for %v", problems, want)
	}
}

// fakeLedger is a Ledger in memory; Record fails with err when set.
type fakeLedger struct {
	err     error
	records []string // job/kind/holder
}

func (l *fakeLedger) Record(ctx context.Context, job, kind, holder string) error {
	if l.err != nil {
		return l.err
	}
	l.records = append(l.records, job+"/"+kind+"/"+holder)
	return nil
}

func (l *fakeLedger) Counts(ctx context.Context) (map[string]map[string]int, error) {
	return nil, errors.New("not used")
}

// TestAccountingRecords: Consume and Refund reach the ledger with the
// process's holder; a failed write panics (the Pool recovers and logs it),
// so the test sees the record missing rather than a silent success.
func TestAccountingRecords(t *testing.T) {
	t.Parallel()
	l := &fakeLedger{}
	a := &accounting{ledger: l, holder: "p2"}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the job's context may have ended; the write must not care
	a.Consume(ctx, &pool.JobInfo{ID: "j1"}, &pool.Result{})
	a.Refund(ctx, &pool.JobInfo{ID: "j2"}, pool.ErrCancelled)
	if want := []string{"j1/consume/p2", "j2/refund/p2"}; !slices.Equal(l.records, want) {
		t.Errorf("records %v, want %v", l.records, want)
	}

	l.err = errors.New("store down")
	defer func() {
		if r := recover(); r == nil {
			t.Error("a failed Record did not panic")
		}
	}()
	a.Consume(t.Context(), &pool.JobInfo{ID: "j3"}, &pool.Result{})
}

// TestOpenChecksParts: Open must return every required part; when one is
// missing, the error names it and what Open opened is closed.
func TestOpenChecksParts(t *testing.T) {
	t.Parallel()
	closed := false
	a := Adapter{Name: "fake", Open: func(ctx context.Context, env string, log *slog.Logger) (*Parts, error) {
		return &Parts{Ledger: &fakeLedger{}, DAGStore: dag.NewMemoryStore(), Close: func(context.Context) error {
			closed = true
			return nil
		}}, nil
	}}
	_, err := a.open(t.Context(), "env", nil)
	if err == nil || !strings.Contains(err.Error(), "Driver, Failover, Leases") {
		t.Errorf("open: %v, want it to name Driver, Failover and Leases", err)
	}
	if !closed {
		t.Error("the parts were not closed")
	}

	a.Open = func(ctx context.Context, env string, log *slog.Logger) (*Parts, error) {
		return nil, errors.New("no server")
	}
	if _, err := a.open(t.Context(), "env", nil); err == nil || !strings.Contains(err.Error(), "no server") {
		t.Errorf("open: %v, want Open's error", err)
	}
}

// TestChildTake: expect's line matching takes the first line with the
// prefix and drops the ones before it.
func TestChildTake(t *testing.T) {
	t.Parallel()
	c := &child{lines: []string{"resumed x1", "dag d1", "ready", "dag d2"}}
	if got, ok := c.take("dag"); !ok || got != "d1" {
		t.Errorf("take(dag) = %q, %v; want d1", got, ok)
	}
	if got, ok := c.take("dag"); !ok || got != "d2" {
		t.Errorf("second take(dag) = %q, %v; want d2 (ready dropped on the way)", got, ok)
	}
	if _, ok := c.take("ready"); ok {
		t.Error("take(ready) found a line already dropped")
	}
}

// TestPromptColor reads node 1's color, 0 for a prompt without one.
func TestPromptColor(t *testing.T) {
	t.Parallel()
	for prompt, want := range map[string]int{
		`{"1": {"class_type": "EmptyImage", "inputs": {"color": 42, "width": 8}}}`: 42,
		`{"1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}}}`:         0,
		`{}`: 0,
	} {
		got, err := promptColor([]byte(prompt))
		if err != nil || got != want {
			t.Errorf("promptColor(%s) = %d, %v; want %d", prompt, got, err, want)
		}
	}
	if _, err := promptColor([]byte(`{`)); err == nil {
		t.Error("promptColor of broken JSON: no error")
	}
}
