package memqueue

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/comfypool/comfypool/queue"
)

// Defaults for zero Config fields.
const (
	DefaultCapacity    = 10_000
	DefaultRetention   = time.Hour
	DefaultMaxRetained = 10_000
)

// Config configures a Queue. The zero value is usable; New copies it.
type Config struct {
	// Capacity bounds the unfinished jobs (queued + retrying + leased);
	// Enqueue beyond it fails with a *queue.FullError. Defaults to
	// DefaultCapacity (10,000). Zero means default; -1 means unbounded.
	Capacity int
	// Retention is how long terminal jobs (completed, dead, cancelled) are
	// kept for Get and idempotency checks after they finish. Defaults to
	// DefaultRetention (1h). Zero means default; negative is invalid.
	Retention time.Duration
	// MaxRetained bounds the number of terminal jobs kept; the oldest are
	// dropped first. Defaults to DefaultMaxRetained (10,000). Zero means
	// default; -1 keeps none (a finished job is dropped at once).
	MaxRetained int
	// Test holds test-only knobs.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// Now replaces time.Now as the queue's clock. Lease expiry and retry
	// delays are evaluated against it on every call; the Ready timer still
	// runs on real (or synctest) time. Nil means time.Now.
	Now func() time.Time
}

func (c *Config) withDefaults() Config {
	d := *c
	d.Capacity = cmp.Or(d.Capacity, DefaultCapacity)
	d.Retention = cmp.Or(d.Retention, DefaultRetention)
	d.MaxRetained = cmp.Or(d.MaxRetained, DefaultMaxRetained)
	if d.Test.Now == nil {
		d.Test.Now = time.Now
	}
	return d
}

func (c *Config) validate() error {
	if c.Capacity < -1 {
		return errors.New("memqueue: Capacity must be positive, 0 (default) or -1 (unbounded)")
	}
	if c.Retention < 0 {
		return errors.New("memqueue: Retention cannot be negative")
	}
	if c.MaxRetained < -1 {
		return errors.New("memqueue: MaxRetained must be positive, 0 (default) or -1 (none)")
	}
	return nil
}

// entry is the internal record of one job.
type entry struct {
	job      queue.Job
	seq      uint64
	bucket   *bucket
	readyIdx int // position in bucket.h while queued
	ageIdx   int // position in Queue.age while queued
	timeIdx  int // position in Queue.delayed (retrying) or Queue.leased (leased)
	retained *list.Element
}

// bucket holds the queued jobs of one (Workflow, Requires, Needs,
// ExcludeBackends) combination, in lease order. Lease looks only at bucket
// heads.
type bucket struct {
	workflow string
	key      string
	requires []string
	needs    []string
	excludes []string
	h        ixheap
	// meets caches whether a capability set (by digest) meets needs: a
	// set's content never changes under its digest.
	meets map[string]bool
}

// maxMeetsCache bounds bucket.meets; a full cache is cleared (capability
// sets change when backends reconnect, so old digests pile up).
const maxMeetsCache = 64

// meetsNeeds reports whether has meets the bucket's needs, from the cache
// when it can.
func (b *bucket) meetsNeeds(has *queue.Capabilities) bool {
	if len(b.needs) == 0 || has == nil {
		return true
	}
	d := has.Digest()
	if ok, hit := b.meets[d]; hit {
		return ok
	}
	ok := has.MeetsAll(b.needs)
	if b.meets == nil || len(b.meets) >= maxMeetsCache {
		b.meets = make(map[string]bool)
	}
	b.meets[d] = ok
	return ok
}

func readyLess(a, b *entry) bool {
	if a.job.Priority != b.job.Priority {
		return a.job.Priority > b.job.Priority
	}
	if c := a.job.EnqueuedAt.Compare(b.job.EnqueuedAt); c != 0 {
		return c < 0
	}
	return a.seq < b.seq
}

func ageLess(a, b *entry) bool {
	if c := a.job.EnqueuedAt.Compare(b.job.EnqueuedAt); c != 0 {
		return c < 0
	}
	return a.seq < b.seq
}

func delayLess(a, b *entry) bool {
	if c := a.job.AvailableAt.Compare(b.job.AvailableAt); c != 0 {
		return c < 0
	}
	return a.seq < b.seq
}

func leaseLess(a, b *entry) bool {
	if c := a.job.LeaseExpiresAt.Compare(b.job.LeaseExpiresAt); c != 0 {
		return c < 0
	}
	return a.seq < b.seq
}

// Queue is the in-memory [queue.Driver]. Enqueue and Lease are O(log n) in
// the number of queued jobs plus O(b) in the number of distinct
// (Workflow, Requires, Needs, ExcludeBackends) combinations among queued
// jobs (Lease compares only the head of each such bucket the backend
// accepts; whether a capability set meets a bucket's Needs is computed once
// per set digest and cached). It implements
// [queue.Notifier] and [queue.SpaceNotifier] with one time.AfterFunc timer set
// for the next retry or lease expiry; Close stops it.
//
// Use it through [queue.New]. A Queue is safe for concurrent use by multiple
// goroutines.
type Queue struct {
	cfg Config
	now func() time.Time

	mu       sync.Mutex
	closed   bool
	jobs     map[string]*entry
	keys     map[string]string             // idempotency key → job ID
	buckets  map[string]map[string]*bucket // workflow → requires key → bucket
	age      ixheap                        // queued, by age
	delayed  ixheap                        // retrying, by AvailableAt
	leased   ixheap                        // leased, by LeaseExpiresAt
	retained list.List                     // terminal entries, oldest first
	counts   map[queue.State]int
	active   int // queued + retrying + leased
	seq      uint64
	space    chan struct{} // closed and replaced when capacity frees
	timer    *time.Timer
	timerAt  time.Time

	ready chan struct{} // 1-buffered, coalescing
}

var (
	_ queue.Driver        = (*Queue)(nil)
	_ queue.Notifier      = (*Queue)(nil)
	_ queue.SpaceNotifier = (*Queue)(nil)
)

// New returns an empty in-memory queue. cfg may be nil (all defaults); it is
// copied, not retained. Errors name the invalid field.
func New(cfg *Config) (*Queue, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	q := &Queue{
		cfg:     c,
		now:     c.Test.Now,
		jobs:    make(map[string]*entry),
		keys:    make(map[string]string),
		buckets: make(map[string]map[string]*bucket),
		counts:  make(map[queue.State]int),
		space:   make(chan struct{}),
		ready:   make(chan struct{}, 1),
	}
	q.age = ixheap{less: ageLess, slot: func(e *entry) *int { return &e.ageIdx }}
	q.delayed = ixheap{less: delayLess, slot: func(e *entry) *int { return &e.timeIdx }}
	q.leased = ixheap{less: leaseLess, slot: func(e *entry) *int { return &e.timeIdx }}
	return q, nil
}

// Len returns the number of job records held in memory (unfinished plus
// retained terminal ones).
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs)
}

// Ready implements [queue.Notifier].
func (q *Queue) Ready() <-chan struct{} { return q.ready }

// SpaceAvailable implements [queue.SpaceNotifier].
func (q *Queue) SpaceAvailable() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.space
}

// Close stops the timer and makes later calls return queue.ErrClosed. It is
// idempotent and always returns nil.
func (q *Queue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	if q.timer != nil {
		q.timer.Stop()
	}
	close(q.space)
	return nil
}

// begin locks q, fails if closed or ctx is done, and applies due transitions.
// The caller must call q.end.
func (q *Queue) begin(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return time.Time{}, queue.ErrClosed
	}
	now := q.now()
	q.tick(now)
	return now, nil
}

func (q *Queue) end(now time.Time) {
	q.schedule(now)
	q.mu.Unlock()
}

func (q *Queue) signalReady() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *Queue) setState(e *entry, s queue.State) {
	if e.job.State != "" {
		q.counts[e.job.State]--
	}
	e.job.State = s
	q.counts[s]++
}

// tick applies the transitions due at now: retry delays that elapsed, leases
// that expired, terminal records past retention.
func (q *Queue) tick(now time.Time) {
	for e := q.delayed.peek(); e != nil && !now.Before(e.job.AvailableAt); e = q.delayed.peek() {
		q.delayed.remove(e)
		q.makeQueued(e)
	}
	for e := q.leased.peek(); e != nil && !now.Before(e.job.LeaseExpiresAt); e = q.leased.peek() {
		q.leased.remove(e)
		at := e.job.LeaseExpiresAt
		q.closeAttempt(e, at, queue.ErrorSummary{Class: queue.ClassLeaseExpired, Message: "queue: lease expired"}, true, true)
		e.job.Version++
		if e.job.AttemptsUsed >= e.job.MaxAttempts {
			e.job.Error = e.job.Attempts[len(e.job.Attempts)-1].Error
			q.finish(e, queue.StateDead, now)
		} else {
			q.clearLease(e)
			e.job.AvailableAt = now
			q.makeQueued(e)
		}
	}
	q.prune(now)
}

// schedule arms the timer for the next retry or lease expiry.
func (q *Queue) schedule(now time.Time) {
	var next time.Time
	if e := q.delayed.peek(); e != nil {
		next = e.job.AvailableAt
	}
	if e := q.leased.peek(); e != nil && (next.IsZero() || e.job.LeaseExpiresAt.Before(next)) {
		next = e.job.LeaseExpiresAt
	}
	if next.IsZero() || (!q.timerAt.IsZero() && !next.Before(q.timerAt)) {
		return // nothing due, or the timer fires earlier and reschedules
	}
	q.timerAt = next
	if q.timer == nil {
		q.timer = time.AfterFunc(next.Sub(now), q.onTimer)
	} else {
		q.timer.Reset(next.Sub(now))
	}
}

func (q *Queue) onTimer() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.timerAt = time.Time{}
	now := q.now()
	q.tick(now)
	q.schedule(now)
}

func (q *Queue) bucketFor(e *entry) *bucket {
	key := strings.Join(e.job.Requires, "\x00") + "\x01" + strings.Join(e.job.ExcludeBackends, "\x00") +
		"\x01" + strings.Join(e.job.Needs, "\x00")
	m := q.buckets[e.job.Workflow]
	if m == nil {
		m = make(map[string]*bucket)
		q.buckets[e.job.Workflow] = m
	}
	b := m[key]
	if b == nil {
		b = &bucket{workflow: e.job.Workflow, key: key, requires: e.job.Requires, needs: e.job.Needs, excludes: e.job.ExcludeBackends}
		b.h = ixheap{less: readyLess, slot: func(e *entry) *int { return &e.readyIdx }}
		m[key] = b
	}
	return b
}

func (q *Queue) makeQueued(e *entry) {
	q.setState(e, queue.StateQueued)
	e.bucket = q.bucketFor(e)
	e.bucket.h.push(e)
	q.age.push(e)
	q.signalReady()
}

func (q *Queue) unqueue(e *entry) {
	b := e.bucket
	b.h.remove(e)
	e.bucket = nil
	if b.h.len() == 0 {
		m := q.buckets[b.workflow]
		delete(m, b.key)
		if len(m) == 0 {
			delete(q.buckets, b.workflow)
		}
	}
	q.age.remove(e)
}

func (q *Queue) clearLease(e *entry) {
	e.job.LeaseToken = ""
	e.job.LeaseExpiresAt = time.Time{}
}

// closeAttempt closes the lease's open attempt at now with err (class
// err.Class, or ClassNone when err is zero), making one first when make is
// set and none is open; counted counts it against MaxAttempts.
func (q *Queue) closeAttempt(e *entry, now time.Time, err queue.ErrorSummary, counted, make bool) {
	a := e.job.OpenAttempt()
	if a == nil {
		if !make {
			return
		}
		e.job.Attempts = append(e.job.Attempts, queue.Attempt{
			Number: len(e.job.Attempts) + 1, Backend: e.job.LeasedBy, StartedAt: e.job.LeasedAt,
		})
		a = &e.job.Attempts[len(e.job.Attempts)-1]
	}
	a.EndedAt = now
	a.Class = err.Class
	if err.IsZero() {
		a.Class = queue.ClassNone
	}
	a.Error = err
	a.Counted = counted
	if counted {
		e.job.AttemptsUsed++
	}
}

// finish moves an unfinished entry (already out of every heap) to a terminal
// state and into the retention list.
func (q *Queue) finish(e *entry, s queue.State, now time.Time) {
	q.setState(e, s)
	q.clearLease(e)
	e.job.FinishedAt = now
	q.active--
	close(q.space)
	q.space = make(chan struct{})
	e.retained = q.retained.PushBack(e)
	q.prune(now)
}

func (q *Queue) prune(now time.Time) {
	for el := q.retained.Front(); el != nil; el = q.retained.Front() {
		e := el.Value.(*entry)
		over := q.cfg.MaxRetained == -1 || q.retained.Len() > q.cfg.MaxRetained
		if !over && now.Before(e.job.FinishedAt.Add(q.cfg.Retention)) {
			return
		}
		q.retained.Remove(el)
		q.counts[e.job.State]--
		delete(q.jobs, e.job.ID)
		if k := e.job.IdempotencyKey; k != "" && q.keys[k] == e.job.ID {
			delete(q.keys, k)
		}
	}
}

// Enqueue implements [queue.Driver].
func (q *Queue) Enqueue(ctx context.Context, p *queue.EnqueueParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	if k := p.IdempotencyKey; k != "" {
		if id, ok := q.keys[k]; ok {
			return nil, &queue.DuplicateError{Key: k, ExistingID: id}
		}
	}
	if q.cfg.Capacity > 0 && q.active >= q.cfg.Capacity {
		return nil, &queue.FullError{Capacity: q.cfg.Capacity}
	}
	q.seq++
	e := &entry{seq: q.seq, readyIdx: -1, ageIdx: -1, timeIdx: -1}
	e.job = queue.Job{
		ID:              uuid.NewString(),
		Priority:        p.Priority,
		Version:         1,
		Payload:         slices.Clone(p.Payload),
		Metadata:        maps.Clone(p.Metadata),
		Workflow:        p.Workflow,
		WorkflowKey:     p.WorkflowKey,
		Overrides:       slices.Clone(p.Overrides),
		Requires:        slices.Clone(p.Requires),
		Needs:           slices.Clone(p.Needs),
		ExcludeBackends: slices.Clone(p.ExcludeBackends),
		IdempotencyKey:  p.IdempotencyKey,
		MaxAttempts:     max(p.MaxAttempts, 1),
		EnqueuedAt:      now,
		AvailableAt:     now,
	}
	q.jobs[e.job.ID] = e
	if p.IdempotencyKey != "" {
		q.keys[p.IdempotencyKey] = e.job.ID
	}
	q.active++
	q.makeQueued(e)
	return e.job.Clone(), nil
}

func accepts(b *bucket, p *queue.LeaseParams) bool {
	for _, r := range b.requires {
		if !slices.Contains(p.Tags, r) {
			return false
		}
	}
	return !slices.Contains(b.excludes, p.Backend) && b.meetsNeeds(p.Has)
}

// Lease implements [queue.Driver].
func (q *Queue) Lease(ctx context.Context, p *queue.LeaseParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	var best *entry
	bestPref := false
	// better orders bucket heads: priority, then PreferWorkflows, then age.
	better := func(h *entry, pref bool) bool {
		if best == nil {
			return true
		}
		if h.job.Priority != best.job.Priority {
			return h.job.Priority > best.job.Priority
		}
		if pref != bestPref {
			return pref
		}
		return readyLess(h, best)
	}
	consider := func(w string, m map[string]*bucket) {
		if slices.Contains(p.ExcludeWorkflows, w) {
			return
		}
		pref := slices.Contains(p.PreferWorkflows, w)
		for _, b := range m {
			if h := b.h.peek(); h != nil && better(h, pref) && accepts(b, p) {
				best, bestPref = h, pref
			}
		}
	}
	if p.Workflows == nil {
		for w, m := range q.buckets {
			consider(w, m)
		}
	} else {
		for _, w := range p.Workflows {
			consider(w, q.buckets[w])
		}
	}
	if best == nil {
		return nil, nil
	}
	q.unqueue(best)
	q.setState(best, queue.StateLeased)
	best.job.LeasedBy = p.Backend
	best.job.LeaseToken = uuid.NewString()
	best.job.LeasedAt = now
	best.job.LeaseExpiresAt = now.Add(p.Duration)
	best.job.Version++
	q.leased.push(best)
	return best.job.Clone(), nil
}

// holder returns the entry leased under token.
func (q *Queue) holder(id, token string) (*entry, error) {
	e, err := q.find(id)
	if err != nil {
		return nil, err
	}
	if e.job.State != queue.StateLeased || e.job.LeaseToken != token {
		return nil, fmt.Errorf("%w: job %s is %s", queue.ErrLeaseLost, id, e.job.State)
	}
	return e, nil
}

// find returns the job's entry or an error wrapping queue.ErrNotFound.
func (q *Queue) find(id string) (*entry, error) {
	if e := q.jobs[id]; e != nil {
		return e, nil
	}
	return nil, fmt.Errorf("%w: %s", queue.ErrNotFound, id)
}

// Extend implements [queue.Driver].
func (q *Queue) Extend(ctx context.Context, id, token string, d time.Duration) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	e, err := q.holder(id, token)
	if err != nil {
		return nil, err
	}
	e.job.LeaseExpiresAt = now.Add(d)
	e.job.Version++
	q.leased.fix(e)
	return e.job.Clone(), nil
}

// Begin implements [queue.Driver].
func (q *Queue) Begin(ctx context.Context, id, token string, p *queue.BeginParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	e, err := q.holder(id, token)
	if err != nil {
		return nil, err
	}
	q.closeAttempt(e, now, queue.ErrorSummary{Class: queue.ClassSuperseded}, false, false)
	e.job.Attempts = append(e.job.Attempts, queue.Attempt{
		Number: len(e.job.Attempts) + 1, Backend: cmp.Or(p.Backend, e.job.LeasedBy),
		PromptID: p.PromptID, StartedAt: now,
	})
	e.job.Version++
	return e.job.Clone(), nil
}

// Complete implements [queue.Driver].
func (q *Queue) Complete(ctx context.Context, id, token string, result []byte) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	e, err := q.holder(id, token)
	if err != nil {
		return nil, err
	}
	q.leased.remove(e)
	q.closeAttempt(e, now, queue.ErrorSummary{}, true, true)
	e.job.Version++
	e.job.Result = slices.Clone(result)
	q.finish(e, queue.StateCompleted, now)
	return e.job.Clone(), nil
}

// Fail implements [queue.Driver].
func (q *Queue) Fail(ctx context.Context, id, token string, p *queue.FailParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	e, err := q.holder(id, token)
	if err != nil {
		return nil, err
	}
	q.leased.remove(e)
	q.closeAttempt(e, now, p.Error, true, true)
	e.job.Version++
	backend := e.job.Attempts[len(e.job.Attempts)-1].Backend
	if p.ExcludeBackend && backend != "" && !slices.Contains(e.job.ExcludeBackends, backend) {
		e.job.ExcludeBackends = append(slices.Clone(e.job.ExcludeBackends), backend)
		slices.Sort(e.job.ExcludeBackends)
	}
	setNeeds(e, p.Needs)
	switch {
	case p.NoRetry || e.job.AttemptsUsed >= e.job.MaxAttempts:
		e.job.Error = p.Error
		q.finish(e, queue.StateDead, now)
	case p.RetryAfter > 0:
		q.clearLease(e)
		e.job.AvailableAt = now.Add(p.RetryAfter)
		q.setState(e, queue.StateRetrying)
		q.delayed.push(e)
	default:
		q.clearLease(e)
		e.job.AvailableAt = now
		q.makeQueued(e)
	}
	return e.job.Clone(), nil
}

// setNeeds replaces e's Needs when needs is not nil. e is in no bucket.
func setNeeds(e *entry, needs []string) {
	if needs == nil {
		return
	}
	if len(needs) == 0 {
		e.job.Needs = nil
		return
	}
	e.job.Needs = slices.Clone(needs)
}

// Requeue implements [queue.Driver].
func (q *Queue) Requeue(ctx context.Context, id, token string, p *queue.RequeueParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	e, err := q.holder(id, token)
	if err != nil {
		return nil, err
	}
	q.leased.remove(e)
	q.closeAttempt(e, now, p.Error, false, false)
	e.job.Version++
	q.clearLease(e)
	setNeeds(e, p.Needs)
	e.job.AvailableAt = now
	q.makeQueued(e)
	return e.job.Clone(), nil
}

// Cancel implements [queue.Driver].
func (q *Queue) Cancel(ctx context.Context, id string, p *queue.CancelParams) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	e, err := q.find(id)
	if err != nil {
		return nil, err
	}
	switch e.job.State {
	case queue.StateQueued:
		q.unqueue(e)
	case queue.StateRetrying:
		q.delayed.remove(e)
	case queue.StateLeased:
		q.leased.remove(e)
		q.closeAttempt(e, now, queue.ErrorSummary{Class: queue.ClassCancelled, Message: p.Error.Message}, false, false)
	case queue.StateCancelled:
		return e.job.Clone(), nil
	default:
		return nil, fmt.Errorf("%w: cannot cancel job %s: it is %s", queue.ErrInvalidState, id, e.job.State)
	}
	e.job.Error = p.Error
	e.job.Version++
	q.finish(e, queue.StateCancelled, now)
	q.signalReady()
	return e.job.Clone(), nil
}

// Get implements [queue.Driver].
func (q *Queue) Get(ctx context.Context, id string) (*queue.Job, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	e, err := q.find(id)
	if err != nil {
		return nil, err
	}
	return e.job.Clone(), nil
}

// Stats implements [queue.Driver].
func (q *Queue) Stats(ctx context.Context) (*queue.Stats, error) {
	now, err := q.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer q.end(now)
	s := &queue.Stats{
		Queued:    q.counts[queue.StateQueued],
		Leased:    q.counts[queue.StateLeased],
		Retrying:  q.counts[queue.StateRetrying],
		Completed: q.counts[queue.StateCompleted],
		Dead:      q.counts[queue.StateDead],
		Cancelled: q.counts[queue.StateCancelled],
		Capacity:  max(q.cfg.Capacity, 0),
	}
	if e := q.age.peek(); e != nil {
		s.OldestQueuedAge = now.Sub(e.job.EnqueuedAt)
	}
	return s, nil
}
