package redisqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
)

// DefaultPrefix is the key prefix of a Config without one.
const DefaultPrefix = "comfypool"

// DefaultPollInterval is the fallback poll interval of a Config with zero.
const DefaultPollInterval = time.Second

// ConnectTimeout bounds the I/O of [New] (the first subscription).
const ConnectTimeout = 10 * time.Second

// Config configures a [Driver]. The zero value is usable; New copies it.
type Config struct {
	// Prefix names the queue: every key of it is "{Prefix}:..." (see the
	// package doc). Drivers with the same Prefix on the same server share
	// one queue. Defaults to DefaultPrefix.
	Prefix string
	// Capacity bounds the unfinished jobs (queued, leased, retrying):
	// Enqueue at capacity returns a *queue.FullError. Zero (the default)
	// means unbounded.
	Capacity int
	// PollInterval is how often the driver looks for leasable work and
	// due transitions on its own, checks that its subscription still
	// receives what is published, and repairs orphaned leases, in case
	// messages were lost. Defaults to DefaultPollInterval (1s).
	PollInterval time.Duration
	// Retention, when positive, makes the driver delete completed, dead
	// and cancelled jobs that finished longer ago than Retention, in a
	// background sweep every PollInterval; an unsettled job is kept until
	// it is settled. Zero (the default) keeps them until Purge.
	Retention time.Duration
	// Logger receives the driver's logs (subscription trouble). Nil means
	// slog.Default().
	Logger *slog.Logger
	// Test holds test-only knobs.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// Now replaces the Redis server's clock for every time the driver
	// writes or compares. Nil (production) means the server's clock
	// (TIME), so that every process on the queue uses one clock.
	Now func() time.Time
}

// Driver is the Redis [queue.Driver]. It implements [queue.Notifier],
// [queue.Watcher], [queue.IDEnqueuer], [queue.SpaceNotifier] and
// [queue.Settler]. Use it through [queue.New]. A Driver is safe for
// concurrent use by multiple goroutines.
type Driver struct {
	c    redis.UniversalClient
	cfg  Config
	log  *slog.Logger
	p    string   // "{prefix}:"
	keys []string // KEYS of every script: the sequence key (routing)

	closeOnce sync.Once
	closed    chan struct{}
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	group grouper // job operations sharing one script call (group.go)
	held  held    // the records of the leases held here (held.go)

	noFunctions atomic.Bool // the server runs no Functions: EVALSHA (scripts.go)

	psMu     sync.Mutex
	ps       *redis.PubSub // the subscription (listen.go)
	psClosed bool          // Close closed it

	ready chan struct{}
	kick  chan struct{} // wakes the maintenance loop (coalesced)

	armed atomic.Int64 // µs of the maintenance timer's target (server clock); 0: none
	feed  queue.Feed   // the subscription publishes to it

	synced syncs // writes waiting for their own message (runSynced)

	spaceMu sync.Mutex
	space   chan struct{} // closed when capacity may have been freed (SpaceAvailable)

	// The check that published messages arrive (see maintain).
	pingID             string
	pingSent, pingSeen atomic.Uint64
	dropMessages       atomic.Bool // tests: lose every message
}

// New returns a Driver on c, which the caller keeps owning: Close stops
// the driver's goroutines and its subscription, never c. c may be a
// *redis.Client, a *redis.ClusterClient or a failover client: its options
// carry the password and TLS settings. New subscribes to the queue's
// channel before it returns (bounded by ConnectTimeout), so that no
// change made after New returns is missed.
func New(c redis.UniversalClient, cfg *Config) (*Driver, error) {
	if c == nil {
		return nil, errors.New("redisqueue: client is required")
	}
	var conf Config
	if cfg != nil {
		conf = *cfg
	}
	conf.Prefix = cmp.Or(conf.Prefix, DefaultPrefix)
	conf.PollInterval = cmp.Or(conf.PollInterval, DefaultPollInterval)
	switch {
	case conf.PollInterval < 0:
		return nil, errors.New("redisqueue: PollInterval cannot be negative")
	case conf.Retention < 0:
		return nil, errors.New("redisqueue: Retention cannot be negative")
	case conf.Capacity < 0:
		return nil, errors.New("redisqueue: Capacity cannot be negative")
	}
	if conf.Logger == nil {
		conf.Logger = slog.Default()
	}
	p := "{" + conf.Prefix + "}:"
	d := &Driver{
		c:      c,
		cfg:    conf,
		log:    conf.Logger.With("component", "redisqueue", "prefix", conf.Prefix),
		p:      p,
		keys:   []string{p + "seq"},
		closed: make(chan struct{}),
		ready:  make(chan struct{}, 1),
		kick:   make(chan struct{}, 1),
		pingID: uuid.NewString(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	subCtx, cancelSub := context.WithTimeout(ctx, ConnectTimeout)
	defer cancelSub()
	ps := c.Subscribe(subCtx, d.channel())
	if _, err := ps.Receive(subCtx); err != nil { // the subscription's confirmation
		_ = ps.Close()
		cancel()
		return nil, wrapErr("subscribe", err)
	}
	d.ps = ps
	d.wg.Add(2)
	go d.listen(ctx)
	go d.maintain(ctx)
	return d, nil
}

// channel is the queue's pub/sub channel.
func (d *Driver) channel() string { return d.p + "ch" }

// Close stops the driver: its goroutines and its subscription end, every
// subscription's channel is closed and later calls return queue.ErrClosed.
// It does not close the client.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		close(d.closed)
		d.cancel()
		d.psMu.Lock()
		d.psClosed = true
		_ = d.ps.Close() // a pending Receive does not watch its context
		d.psMu.Unlock()
		d.wg.Wait()
		d.feed.Close()
	})
	return nil
}

// check returns ErrClosed after Close, else ctx's error.
func (d *Driver) check(ctx context.Context) error {
	select {
	case <-d.closed:
		return queue.ErrClosed
	default:
	}
	return ctx.Err()
}

// now returns the ARGV[2] of a script: the test clock's time in µs, or ""
// for the server's clock.
func (d *Driver) now() string {
	if d.cfg.Test.Now == nil {
		return ""
	}
	return strconv.FormatInt(d.cfg.Test.Now().UnixMicro(), 10)
}

// run runs a script with the prefix and clock arguments before args.
func (d *Driver) run(ctx context.Context, name string, args ...any) (any, error) {
	return d.runTag(ctx, name, "", args...)
}

func (d *Driver) runTag(ctx context.Context, name, tag string, args ...any) (any, error) {
	all := make([]any, 0, 2+len(args))
	clock := d.now()
	if tag != "" {
		clock += "|" + tag
	}
	all = append(all, d.p, clock)
	all = append(all, args...)
	return d.call(ctx, name, all)
}

// runSynced is run for a script that writes jobs: when this process has
// subscribers, it returns only once the driver's own subscription has
// delivered the script's changes to them (the script tags its message),
// so that a caller's Subscribe sees its own write before the write
// returns, in order with every other process's, as memqueue's would.
// Without subscribers it costs nothing more than run.
func (d *Driver) runSynced(ctx context.Context, name string, args ...any) (any, error) {
	if d.feed.Subscribers() == 0 {
		return d.run(ctx, name, args...)
	}
	seq, seen := d.synced.expect()
	res, err := d.runTag(ctx, name, d.pingID+":"+strconv.FormatUint(seq, 10), args...)
	if err == nil {
		timer := time.NewTimer(syncWait)
		select {
		case <-seen:
		case <-timer.C: // the message was lost: its Gap tells the subscribers
		case <-d.closed:
		}
		timer.Stop()
	}
	d.synced.forget(seq)
	return res, err
}

// syncWait bounds how long runSynced waits for its message.
const syncWait = time.Second

// syncs tracks the tagged messages runSynced waits for.
type syncs struct {
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan struct{}
}

// expect returns a new tag's sequence and a channel closed when the
// subscription delivers it.
func (s *syncs) expect() (uint64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	if s.waiting == nil {
		s.waiting = map[uint64]chan struct{}{}
	}
	ch := make(chan struct{})
	s.waiting[s.next] = ch
	return s.next, ch
}

// seen releases the waiter of seq.
func (s *syncs) seen(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.waiting[seq]; ok {
		close(ch)
		delete(s.waiting, seq)
	}
}

// forget drops seq's waiter, if still there.
func (s *syncs) forget(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.waiting, seq)
}

// releaseAll releases every waiter: messages were lost (a Gap).
func (s *syncs) releaseAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for seq, ch := range s.waiting {
		close(ch)
		delete(s.waiting, seq)
	}
}

// micros returns d in whole microseconds, at least 1.
func micros(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Microsecond-1)/time.Microsecond), 1), 10)
}

// signalReady fires Ready without blocking.
func (d *Driver) signalReady() {
	select {
	case d.ready <- struct{}{}:
	default:
	}
}

// SpaceAvailable implements [queue.SpaceNotifier]: the channel is closed
// when a job of the queue, in any process, next finishes or is
// cancelled (seen on the queue's channel), or at the next PollInterval
// when a Capacity is set (in case that message was lost).
func (d *Driver) SpaceAvailable() <-chan struct{} {
	d.spaceMu.Lock()
	defer d.spaceMu.Unlock()
	if d.space == nil {
		d.space = make(chan struct{})
	}
	return d.space
}

// signalSpace wakes the SpaceAvailable waiters.
func (d *Driver) signalSpace() {
	d.spaceMu.Lock()
	defer d.spaceMu.Unlock()
	if d.space != nil {
		close(d.space)
		d.space = nil
	}
}

// Ready implements [queue.Notifier].
func (d *Driver) Ready() <-chan struct{} { return d.ready }

// Subscribe implements [queue.Watcher]: changes come through the queue's
// pub/sub channel from every process.
func (d *Driver) Subscribe(ctx context.Context, buffer int) (<-chan queue.Change, func(), error) {
	if err := d.check(ctx); err != nil {
		return nil, nil, err
	}
	ch, cancel := d.feed.Subscribe(buffer)
	return ch, cancel, nil
}

var (
	_ queue.Driver     = (*Driver)(nil)
	_ queue.Notifier   = (*Driver)(nil)
	_ queue.Watcher    = (*Driver)(nil)
	_ queue.IDEnqueuer = (*Driver)(nil)
	_ queue.Settler    = (*Driver)(nil)

	_ queue.SpaceNotifier = (*Driver)(nil)
)

// errorf builds the error of a failed token operation.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}
