package redisqueue

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/failover"
	"github.com/comfypool/comfypool/pool"
)

// DefaultFailoverRefresh is FailoverConfig.RefreshInterval's default.
const DefaultFailoverRefresh = 30 * time.Second

// Failover is a failover.Strategy whose pair states live in Redis, shared
// by every process on the Prefix: a (backend, workflow) pair blocked by
// one process is skipped by all, and a new Failover on the Prefix (a
// restart) remembers the blocks in force. It decides with the same
// failover.Rules as failover.SmartFailover, from the same failover.Config.
//
// Allowed and Blocked read an in-memory view of the blocks (a
// failover.SharedView), kept fresh by
// the Prefix's pub/sub channel "{Prefix}:fo:changes" (every change of a
// block is numbered and published by the script that makes it, so a
// message delivered after a newer change of its pair is ignored) and,
// should a message be lost, read again in full every RefreshInterval and
// whenever the subscription is re-established. Blocks end by the Redis
// server's clock (TIME): the view corrects for this process's clock
// being off.
//
// Its keys, in the hash slot of "{Prefix}": "{Prefix}:fo:pairs", a hash
// of every pair's state (failures, blocks, end of its block);
// "{Prefix}:fo:until", a sorted set of the blocked pairs by the end of
// their block; "{Prefix}:fo:seq", the number of the last change of a
// block; and "{Prefix}:fo:w:<token>", for a minute after each write of a
// failure (see failScript). Each RecordSuccess is one Lua script. Each
// counted RecordFailure reads the pair, applies failover.Rules in Go (the
// one place that decides), and writes the result with one Lua script
// that checks the pair did not change meanwhile (starting again from the
// new state when it did), so failures recorded at once by several
// processes are each counted, and a script go-redis runs again after a
// lost answer counts its failure once.
//
// Give it to pool.Config.FailoverStrategy. It implements
// pool.UnblockNotifier (a block's end wakes the Pool's dispatcher),
// pool.BlockLister (a Pool excludes every blocked workflow, also those of
// jobs other processes enqueued) and pool.FailoverEventSource (each Pool
// it serves publishes the blocks and unblocks OnEvent receives, those
// other processes decided included, as client:blocked_workflow and
// client:unblocked_workflow events). It is safe for concurrent use; Close
// stops it (the Pool does not). It does not close the client.
type Failover struct {
	rules   *failover.Rules
	view    *failover.SharedView
	c       redis.UniversalClient
	pairs   string // key: member -> encoded failover.Pair
	until   string // key: member by block end (µs)
	seq     string // key: the number of the last change of a block
	writes  string // start of the keys marking writes done (failScript)
	channel string
	refresh time.Duration
	testNow func() time.Time
	log     *slog.Logger

	ps     *redis.PubSub
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// FailoverConfig configures a Failover. The zero value is usable.
type FailoverConfig struct {
	// Prefix names the keys and the channel: everything lives under
	// "{Prefix}:fo:". Processes share blocks when their Failovers have
	// the same Prefix on the same server. Defaults to DefaultPrefix
	// ("comfypool").
	Prefix string
	// Failover holds the rules (failures before a block, cooldown and its
	// growth, classification), as for failover.New; every process on the
	// Prefix should use the same. Nil means failover's defaults. Its
	// OnEvent receives EventBlocked for the blocks this process records
	// (with Failures and Err) and learns of from others (without), and
	// EventUnblocked when a block in force ends or a success clears it,
	// wherever it was recorded; it must not block.
	Failover *failover.Config
	// RefreshInterval is how often the whole view is read again, in case
	// a message was lost. Defaults to DefaultFailoverRefresh (30s).
	RefreshInterval time.Duration
	// Logger receives warnings (a write or read that failed). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Test holds test-only knobs.
	Test FailoverTestConfig
}

// FailoverTestConfig holds test-only knobs of Failover.
type FailoverTestConfig struct {
	// Now, when set, replaces the Redis server's clock (TIME) in every
	// script and in the view (Allowed, Blocked); the timer that ends
	// blocks in the view still runs on real time.
	Now func() time.Time
}

var (
	_ failover.Strategy        = (*Failover)(nil)
	_ pool.UnblockNotifier     = (*Failover)(nil)
	_ pool.BlockLister         = (*Failover)(nil)
	_ pool.FailoverEventSource = (*Failover)(nil)
)

// NewFailover subscribes to the Prefix's changes, reads the blocks in
// force from c's server, starts following the changes and returns the
// Failover. cfg may be nil for defaults; it is copied. ctx bounds the
// subscription and the first read only.
func NewFailover(ctx context.Context, c redis.UniversalClient, cfg *FailoverConfig) (*Failover, error) {
	if c == nil {
		return nil, errors.New("redisqueue: NewFailover: client is required")
	}
	var conf FailoverConfig
	if cfg != nil {
		conf = *cfg
	}
	if conf.RefreshInterval < 0 {
		return nil, errors.New("redisqueue: FailoverConfig.RefreshInterval cannot be negative")
	}
	conf.RefreshInterval = cmp.Or(conf.RefreshInterval, DefaultFailoverRefresh)
	if conf.Logger == nil {
		conf.Logger = slog.Default()
	}
	rules, err := failover.NewRules(conf.Failover)
	if err != nil {
		return nil, fmt.Errorf("redisqueue: FailoverConfig.Failover: %w", err)
	}
	ns := keyNamespace(cmp.Or(conf.Prefix, DefaultPrefix)) + "fo:"
	f := &Failover{
		rules: rules,
		view: failover.NewSharedView(&failover.SharedViewConfig{OnEvent: rules.Config().OnEvent,
			Test: failover.SharedViewTestConfig{Now: conf.Test.Now}}),
		c:       c,
		pairs:   ns + "pairs",
		until:   ns + "until",
		seq:     ns + "seq",
		writes:  ns + "w:",
		channel: ns + "changes",
		refresh: conf.RefreshInterval,
		testNow: conf.Test.Now,
		log:     conf.Logger.With("component", "redisqueue.failover"),
	}
	// Subscribed before the first read: a change made in between is then
	// both read and published to us, never missed.
	f.ps = c.Subscribe(ctx)
	if err := f.subscribe(ctx); err != nil {
		_ = f.ps.Close()
		f.view.Close()
		return nil, wrapErr("subscribe to failover changes", err)
	}
	if err := f.reload(ctx); err != nil {
		_ = f.ps.Close()
		f.view.Close()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.wg.Go(func() { f.listen(lctx) })
	return f, nil
}

// subscribe subscribes f.ps to the channel and waits for the server's
// confirmation: from then on every change is published to it.
func (f *Failover) subscribe(ctx context.Context) error {
	if err := f.ps.Subscribe(ctx, f.channel); err != nil {
		return err
	}
	for {
		msg, err := f.ps.ReceiveTimeout(ctx, writeTimeout)
		if err != nil {
			return err
		}
		if s, ok := msg.(*redis.Subscription); ok && s.Kind == "subscribe" && s.Channel == f.channel {
			return nil
		}
	}
}

// pairNote is a message on the channel, after its change number and a
// space: a pair's block as written.
type pairNote struct {
	Backend  string `json:"b"`
	Workflow string `json:"w"`
	// Until is the block's end in Unix microseconds; 0: not blocked.
	Until int64 `json:"u,omitempty"`
}

// member is k's name in the keys: the length of Backend, a colon,
// Backend and Workflow, so that any two strings make one unambiguous
// name.
func member(k failover.Key) string {
	return strconv.Itoa(len(k.Backend)) + ":" + k.Backend + k.Workflow
}

// parseMember is the inverse of member.
func parseMember(s string) (failover.Key, bool) {
	n, rest, ok := strings.Cut(s, ":")
	if !ok {
		return failover.Key{}, false
	}
	l, err := strconv.Atoi(n)
	if err != nil || l < 0 || l > len(rest) {
		return failover.Key{}, false
	}
	return failover.Key{Backend: rest[:l], Workflow: rest[l:]}, true
}

// encodePair is a pair's state in the pairs hash: failures, blocks and
// the end of its block (Unix µs, 0 for none), space-separated.
func encodePair(p failover.Pair) string {
	var until int64
	if !p.Until.IsZero() {
		until = p.Until.UnixMicro()
	}
	return fmt.Sprintf("%d %d %d", p.Failures, p.Blocks, until)
}

// decodePair is the inverse of encodePair; "" (absent) is the zero Pair.
func decodePair(s string) (failover.Pair, error) {
	if s == "" {
		return failover.Pair{}, nil
	}
	var p failover.Pair
	var until int64
	if _, err := fmt.Sscanf(s, "%d %d %d", &p.Failures, &p.Blocks, &until); err != nil {
		return failover.Pair{}, fmt.Errorf("pair state %q: %w", s, err)
	}
	if until != 0 {
		p.Until = time.UnixMicro(until)
	}
	return p, nil
}

// writeToken returns a token naming one write (see failScript).
func writeToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Allowed implements failover.Strategy from the view: it does no I/O.
func (f *Failover) Allowed(k failover.Key) bool { return f.view.Allowed(k) }

// BlockedUntil returns when k's block ends, by the server's clock, and
// whether it is blocked, from the view.
func (f *Failover) BlockedUntil(k failover.Key) (time.Time, bool) { return f.view.BlockedUntil(k) }

// Blocked returns the pairs blocked now, with when each block ends (by
// the server's clock), from the view. It implements pool.BlockLister.
func (f *Failover) Blocked() map[failover.Key]time.Time { return f.view.Blocked() }

// Unblocked implements pool.UnblockNotifier: it receives a value when a
// block in the view ended or was cleared, before that EventUnblocked
// reaches OnEvent.
func (f *Failover) Unblocked() <-chan struct{} { return f.view.Unblocked() }

// writeTimeout bounds a RecordFailure or RecordSuccess, which take no
// context (failover.Strategy), and the wait for a subscription.
const writeTimeout = 10 * time.Second

// maxFailAttempts bounds RecordFailure's compare-and-set rounds: each
// lost round means another process's write to the same pair won, so
// this many in a row mean a storm on one pair.
const maxFailAttempts = 100

// readPairScript: KEYS pairs; ARGV member, clock. It returns {state (""
// when absent), now (µs)}.
var readPairScript = redis.NewScript(luaClock + `
return {redis.call('HGET', KEYS[1], ARGV[1]) or '', now(ARGV[2])}
`)

// luaChange defines change(seq key, channel, message) in a script: it
// numbers a change of a block (the next change number of the Prefix),
// publishes it as "<number> <message>" and returns the number; and
// seen(seq key), the number of the last change, 0 before any.
const luaChange = `
local function change(seq, channel, msg)
	local n = redis.call('INCR', seq)
	redis.call('PUBLISH', channel, string.format('%d ', n) .. msg)
	return n
end
local function seen(seq)
	return tonumber(redis.call('GET', seq) or '0')
end
`

// failScript: KEYS pairs, until, seq, write (the write's token key);
// ARGV member, expected state, next state, next block end (µs, "" when
// the failure did not block), channel, message, clock. When the pair's
// state is still the expected one it writes the next, drops the blocks
// that ended from the until index, numbers and publishes the block (if
// the failure blocked), marks the write done (its token key, for a
// minute) and returns {1, change number (of the block, or the last
// one)}; else it returns {0, state, now (µs)}, to compute again from. A
// run that finds its write marked done returns {1, its number}: go-redis
// ran the script again after losing the first run's answer (maybe after
// another process's write), and the failure is counted once.
var failScript = redis.NewScript(luaClock + luaChange + `
local done = redis.call('GET', KEYS[4])
if done then
	return {1, tonumber(done)}
end
local t = now(ARGV[7])
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[2] then
	return {0, cur, t}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', t))
local n
if ARGV[4] ~= '' then
	redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
	n = change(KEYS[3], ARGV[5], ARGV[6])
else
	n = seen(KEYS[3])
end
redis.call('SET', KEYS[4], n, 'PX', 60000)
return {1, n}
`)

// successScript: KEYS pairs, until, seq; ARGV member, channel, message,
// clock. It forgets the pair (failover.Rules.Succeed is the zero Pair),
// numbers and publishes the end of its block when it was blocked now,
// and returns the change number (of the unblock, or the last one).
var successScript = redis.NewScript(luaClock + luaChange + `
local t = now(ARGV[4])
local u = redis.call('ZSCORE', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if u and tonumber(u) > t then
	return change(KEYS[3], ARGV[2], ARGV[3])
end
return seen(KEYS[3])
`)

// blocksScript: KEYS until, seq; ARGV clock. It returns {now (µs), change
// number, member, until (µs), ...}: the blocks in force after the
// numbered changes up to that one.
var blocksScript = redis.NewScript(luaClock + luaChange + `
local t = now(ARGV[1])
local r = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%.0f', t), '+inf', 'WITHSCORES')
local out = {t, seen(KEYS[2])}
for i = 1, #r, 2 do
	table.insert(out, r[i])
	table.insert(out, tonumber(r[i + 1]))
end
return out
`)

// RecordSuccess implements failover.Strategy: it forgets the pair, and
// publishes the end of its block if it was blocked. When Redis cannot be
// written, the pair is still allowed here (it just worked) until a
// newer change or read says otherwise.
func (f *Failover) RecordSuccess(k failover.Key) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	w := f.view.BeginWrite(k)
	note, _ := json.Marshal(pairNote{Backend: k.Backend, Workflow: k.Workflow})
	n, err := successScript.Run(ctx, f.c, []string{f.pairs, f.until, f.seq}, member(k), f.channel, string(note), clockArg(f.testNow)).Int64()
	if err != nil {
		f.log.Warn("failover success not recorded", "backend", k.Backend, "workflow", k.Workflow,
			"error", wrapErr("record failover success", err))
		n = 0 // unnumbered: this process's say only
	}
	w.Done(failover.Change{Seq: n}, nil)
}

// RecordFailure implements failover.Strategy: a backend fault updates the
// pair with failover.Rules (compare-and-set: processes failing at once
// count every failure), and publishes a block. When Redis cannot be
// written, the failure is logged and not counted.
func (f *Failover) RecordFailure(k failover.Key, err error) failover.Class {
	class := f.rules.Classify(err)
	if !f.rules.Counts(class) {
		return class
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	w := f.view.BeginWrite(k)
	defer w.Abort() // a failure that did not block (or was not recorded)
	next, blocked, failures, n, werr := f.fail(ctx, k)
	if werr != nil {
		f.log.Warn("failover failure not recorded", "backend", k.Backend, "workflow", k.Workflow, "error", werr)
		return class
	}
	if blocked {
		w.Done(failover.Change{Until: next.Until, Seq: n},
			&failover.Event{Kind: failover.EventBlocked, Key: k, Until: next.Until, Failures: failures, Err: err})
	}
	return class
}

// fail records one failure of k: it reads the pair, applies Rules.Fail
// and writes the result if the pair did not change meanwhile, else
// applies it again to the new state. It returns the pair written,
// whether the failure blocked it, the failures that led to it and the
// change number of the write.
func (f *Failover) fail(ctx context.Context, k failover.Key) (next failover.Pair, blocked bool, failures int, n int64, err error) {
	const op = "record failover failure"
	m := member(k)
	res, err := readPairScript.Run(ctx, f.c, []string{f.pairs}, m, clockArg(f.testNow)).Slice()
	if err != nil {
		return failover.Pair{}, false, 0, 0, wrapErr(op, err)
	}
	for range maxFailAttempts {
		if len(res) < 2 {
			return failover.Pair{}, false, 0, 0, fmt.Errorf("redisqueue: %s: unexpected reply %v", op, res)
		}
		cur, _ := res[0].(string)
		us, _ := res[1].(int64)
		p, err := decodePair(cur)
		if err != nil {
			return failover.Pair{}, false, 0, 0, fmt.Errorf("redisqueue: %s: %w", op, err)
		}
		failures = p.Failures + 1
		next, blocked = f.rules.Fail(p, time.UnixMicro(us))
		nextUntil, note := "", ""
		if blocked {
			nextUntil = strconv.FormatInt(next.Until.UnixMicro(), 10)
			b, _ := json.Marshal(pairNote{Backend: k.Backend, Workflow: k.Workflow, Until: next.Until.UnixMicro()})
			note = string(b)
		}
		state := encodePair(next)
		next, _ = decodePair(state) // microseconds only, as written
		out, err := failScript.Run(ctx, f.c, []string{f.pairs, f.until, f.seq, f.writes + writeToken()},
			m, cur, state, nextUntil, f.channel, note, clockArg(f.testNow)).Slice()
		if err != nil {
			return failover.Pair{}, false, 0, 0, wrapErr(op, err)
		}
		if len(out) == 2 && out[0] == int64(1) {
			n, _ = out[1].(int64)
			return next, blocked, failures, n, nil
		}
		if len(out) < 3 {
			return failover.Pair{}, false, 0, 0, fmt.Errorf("redisqueue: %s: unexpected reply %v", op, out)
		}
		res = out[1:] // another process wrote the pair: start again from its state
	}
	return failover.Pair{}, false, 0, 0, fmt.Errorf("redisqueue: %s: the pair changed %d times in a row", op, maxFailAttempts)
}

// SubscribeEvents implements pool.FailoverEventSource: fn receives, from
// now on, every event OnEvent receives (see FailoverConfig.Failover):
// EventBlocked for the blocks this process records and for those it
// learns of from other processes (when their message arrives, or at the
// next refresh if it was lost), EventUnblocked when a block in the view
// ends or a success anywhere clears it. So every Pool on the Prefix
// publishes every block, whichever process decided it. Blocks in force
// when fn subscribes are not replayed: Blocked lists them.
//
// fn is called after OnEvent, from RecordFailure, RecordSuccess, the
// listener and the view's timer, possibly at once; it must not block
// nor call unsubscribe or Close. After unsubscribe returns fn is not
// called again; unsubscribe may be called more than once.
func (f *Failover) SubscribeEvents(fn func(failover.Event)) (unsubscribe func()) {
	return f.view.SubscribeEvents(fn)
}

// reload reads every block in force, with the number of the last change
// the read reflects (one script: they agree), and brings the view to
// them, measuring this process's clock against the server's.
func (f *Failover) reload(ctx context.Context) error {
	const op = "read failover blocks"
	return f.view.Refresh(func() (failover.Snapshot, error) {
		res, err := blocksScript.Run(ctx, f.c, []string{f.until, f.seq}, clockArg(f.testNow)).Slice()
		if err != nil {
			return failover.Snapshot{}, wrapErr(op, err)
		}
		if len(res) < 2 || len(res)%2 != 0 {
			return failover.Snapshot{}, fmt.Errorf("redisqueue: %s: unexpected reply of %d values", op, len(res))
		}
		serverNow, _ := res[0].(int64)
		n, _ := res[1].(int64)
		s := failover.Snapshot{Blocks: map[failover.Key]time.Time{}, Seq: n, Now: time.UnixMicro(serverNow)}
		for i := 2; i < len(res); i += 2 {
			m, _ := res[i].(string)
			us, _ := res[i+1].(int64)
			k, ok := parseMember(m)
			if !ok {
				f.log.Warn("failover pair not understood", "member", m)
				continue
			}
			s.Blocks[k] = time.UnixMicro(us)
		}
		return s, nil
	})
}

// listen follows the channel's messages until ctx ends, reading the
// whole view again every RefreshInterval and each time the subscription
// is re-established (go-redis resubscribes on a new connection after an
// error; the server's confirmation comes back as a Subscription).
func (f *Failover) listen(ctx context.Context) {
	const minBackoff = 100 * time.Millisecond
	backoff := minBackoff
	next := time.Now().Add(f.refresh)
	for {
		msg, err := f.ps.ReceiveTimeout(ctx, max(time.Until(next), time.Millisecond))
		if ctx.Err() != nil {
			return
		}
		var ne net.Error
		switch {
		case err != nil && errors.As(err, &ne) && ne.Timeout(): // the refresh is due
			if err := f.reload(ctx); err != nil && ctx.Err() == nil {
				f.log.Warn("failover blocks not read", "error", err)
			}
			next = time.Now().Add(f.refresh)
			continue
		case err != nil:
			f.log.Warn("failover changes lost; subscribing again", "error", wrapErr("receive failover changes", err), "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			backoff = min(backoff*2, f.refresh)
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			// Subscribed again: messages may have been lost meanwhile.
			backoff = minBackoff
			if err := f.reload(ctx); err != nil {
				if ctx.Err() == nil {
					f.log.Warn("failover blocks not read after subscribing again", "error", err)
				}
				next = time.Now().Add(backoff) // soon: a change may be missing
			} else {
				next = time.Now().Add(f.refresh)
			}
		case *redis.Message:
			backoff = minBackoff
			num, body, _ := strings.Cut(m.Payload, " ")
			n, err := strconv.ParseInt(num, 10, 64)
			var note pairNote
			if err == nil {
				err = json.Unmarshal([]byte(body), &note)
			}
			if err != nil {
				f.log.Warn("failover message not understood", "error", err)
				continue
			}
			var until time.Time
			if note.Until != 0 {
				until = time.UnixMicro(note.Until)
			}
			f.view.Apply(failover.Key{Backend: note.Backend, Workflow: note.Workflow}, failover.Change{Until: until, Seq: n})
		}
	}
}

// Close stops following changes and the view's timer, and unsubscribes;
// it waits for the events being emitted, and none is emitted after it
// returns, so it must not be called from OnEvent or a SubscribeEvents
// function. It does not change the keys. ctx bounds the wait for the
// listener to end. It may be called more than once.
func (f *Failover) Close(ctx context.Context) error {
	f.view.Close() // waits for the events under way
	f.cancel()
	_ = f.ps.Close() // ends the listener's read
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }() // ends with the listener
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
