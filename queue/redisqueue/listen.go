package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
)

// listen delivers the queue channel's messages until ctx ends. go-redis
// reconnects a lost subscription on the next receive and confirms it
// again; messages published meanwhile are lost, so every confirmation
// after the first gives every subscriber a Gap and fires Ready. When
// maintain closed the subscription (its pings stopped coming back, as
// on a half-open connection that no error reveals), listen subscribes
// again on a new connection.
func (d *Driver) listen(ctx context.Context) {
	defer d.wg.Done()
	backoff := 50 * time.Millisecond
	d.psMu.Lock()
	ps := d.ps
	d.psMu.Unlock()
	for {
		msg, err := ps.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, redis.ErrClosed) {
			d.psMu.Lock()
			if d.psClosed {
				d.psMu.Unlock()
				return
			}
			d.ps = d.c.Subscribe(ctx, d.channel())
			ps = d.ps
			d.psMu.Unlock()
			d.gap()
			continue
		}
		if err != nil {
			d.log.WarnContext(ctx, "redisqueue: subscription lost; reconnecting", "error", wrapErr("subscribe", err))
			d.gap()
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			// A confirmation after a reconnection: what was published in
			// between is lost.
			d.gap()
		case *redis.Message:
			if !d.dropMessages.Load() {
				d.dispatch(m.Payload)
			}
		}
	}
}

// dispatch handles one message of the queue's channel: "c" and changes
// ("id:state:version", comma-separated), "w" (work may be leasable) or
// "p" and a ping ("<driver id>:<n>", see maintain).
func (d *Driver) dispatch(payload string) {
	if payload == "" {
		return
	}
	switch payload[0] {
	case 'w':
		d.signalReady()
	case 'p':
		id, n, ok := strings.Cut(payload[1:], ":")
		if ok && id == d.pingID {
			if v, err := strconv.ParseUint(n, 10, 64); err == nil {
				d.pingSeen.Store(v)
			}
		}
	case 'c':
		tag, changes, _ := strings.Cut(payload[1:], "|")
		defer d.sawTag(tag) // once the changes are delivered
		if changes == "" {
			return
		}
		for entry := range strings.SplitSeq(changes, ",") {
			id, rest, ok1 := strings.Cut(entry, ":")
			st, ver, ok2 := strings.Cut(rest, ":")
			v, err := strconv.ParseUint(ver, 10, 64)
			if !ok1 || !ok2 || err != nil {
				continue
			}
			state := queue.State(st)
			if state == queue.StateQueued {
				d.signalReady()
			}
			if state.Terminal() {
				d.signalSpace()
			}
			d.feed.Publish(queue.Change{JobID: id, State: state, Version: v})
		}
	}
}

// sawTag releases the runSynced call of this driver that tagged a
// message with tag.
func (d *Driver) sawTag(tag string) {
	id, n, ok := strings.Cut(tag, ":")
	if !ok || id != d.pingID {
		return
	}
	if seq, err := strconv.ParseUint(n, 10, 64); err == nil {
		d.synced.seen(seq)
	}
}

// gap tells every subscriber that changes may have been lost, releases
// the writes waiting for their message, and fires Ready.
func (d *Driver) gap() {
	d.feed.Gap()
	d.synced.releaseAll()
	d.signalReady()
}

// arm makes sure the maintenance loop wakes by the next due time a job
// written by this driver brings (its lease's expiry, its retry delay).
func (d *Driver) arm(j *queue.Job) {
	var due time.Time
	switch j.State {
	case queue.StateLeased:
		due = j.LeaseExpiresAt
	case queue.StateRetrying:
		due = j.AvailableAt
	default:
		return
	}
	at := due.UnixMicro()
	if a := d.armed.Load(); a != 0 && a <= at {
		return
	}
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// maintain applies due transitions when they fall due (a timer set on
// the next one) and, every PollInterval: fires Ready while jobs are
// queued (in case a message was lost), checks that its own pings come
// back through the channel (when one has not come back two intervals
// later, messages are being lost without the subscription failing, and
// every subscriber gets a Gap each interval until they come back),
// repairs orphaned leases and, with Retention, purges old jobs.
func (d *Driver) maintain(ctx context.Context) {
	defer d.wg.Done()
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		polled := false
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			polled = true
		case <-timer.C:
		case <-d.kick:
		}
		next, now, queued, err := d.tick(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.log.WarnContext(ctx, "redisqueue: maintenance", "error", err)
		}
		d.armed.Store(0)
		if next > 0 && d.cfg.Test.Now == nil {
			d.armed.Store(next)
			timer.Reset(time.Duration(max(next-now, 0)) * time.Microsecond)
		}
		if !polled {
			continue
		}
		if queued > 0 {
			d.signalReady()
		}
		if d.cfg.Capacity > 0 {
			d.signalSpace() // in case a message was lost: waiters try again
		}
		if sent := d.pingSent.Load(); sent > 0 && sent-d.pingSeen.Load() >= 2 {
			d.gap()
			if sent-d.pingSeen.Load() >= resubscribeAfter {
				d.resubscribe(ctx)
			}
		}
		n := d.pingSent.Add(1)
		if err := d.c.Publish(ctx, d.channel(), "p"+d.pingID+":"+strconv.FormatUint(n, 10)).Err(); err != nil && ctx.Err() == nil {
			d.log.WarnContext(ctx, "redisqueue: ping", "error", wrapErr("ping", err))
		}
		if err := d.reconcile(ctx); err != nil && ctx.Err() == nil {
			d.log.WarnContext(ctx, "redisqueue: reconcile", "error", err)
		}
		if d.cfg.Retention > 0 && now > 0 {
			// By the server's clock (the tick's), as every time of the queue.
			before := time.UnixMicro(now).Add(-d.cfg.Retention)
			if _, err := d.purge(ctx, &queue.PurgeParams{FinishedBefore: before}); err != nil && ctx.Err() == nil {
				d.log.WarnContext(ctx, "redisqueue: retention", "error", err)
			}
		}
	}
}

// tick applies due transitions and returns the next due time, the
// server's time (µs) and the number of queued jobs.
func (d *Driver) tick(ctx context.Context) (next, now int64, queued int, err error) {
	for {
		raw, err := d.run(ctx, "tick", 1000)
		if err != nil {
			return 0, 0, 0, wrapErr("tick", err)
		}
		r, _ := raw.([]any)
		if len(r) != 4 {
			return 0, 0, 0, fmt.Errorf("redisqueue: tick: malformed reply %v", raw)
		}
		applied, _ := r[0].(int64)
		s1, _ := r[1].(string)
		s3, _ := r[3].(string)
		next, _ = strconv.ParseInt(s1, 10, 64)
		now, _ = strconv.ParseInt(s3, 10, 64)
		q, _ := r[2].(int64)
		if applied < 1000 {
			return next, now, int(q), nil
		}
	}
}

// reconcile repairs the leases Redis trouble left orphaned and drops
// the lease records it left stray (see reconcile.lua), looking at the
// leased jobs and the lease records only.
func (d *Driver) reconcile(ctx context.Context) error {
	for _, index := range []string{"jobs", "records"} {
		for offset := int64(0); ; {
			raw, err := d.run(ctx, "reconcile", offset, 500, index)
			if err != nil {
				return wrapErr("reconcile", err)
			}
			r, _ := raw.([]any)
			if len(r) != 3 {
				return fmt.Errorf("redisqueue: reconcile: malformed reply %v", raw)
			}
			if n, _ := r[0].(int64); n > 0 {
				d.log.WarnContext(ctx, "redisqueue: recovered jobs marked leased without a lease record", "jobs", n)
			}
			offset, _ = r[1].(int64)
			if done, _ := r[2].(int64); done == 1 {
				break
			}
		}
	}
	return nil
}

// resubscribeAfter is the number of pings in a row that must not come
// back before maintain subscribes again on a new connection.
const resubscribeAfter = 4

// resubscribe closes the subscription, whose pings stopped coming back
// although no error came (a half-open connection, which TCP keepalive
// would reveal only minutes later); listen then subscribes again on a
// new connection. The ping count starts over.
func (d *Driver) resubscribe(ctx context.Context) {
	d.log.WarnContext(ctx, "redisqueue: the subscription receives nothing; subscribing again")
	d.pingSeen.Store(d.pingSent.Load())
	d.psMu.Lock()
	defer d.psMu.Unlock()
	if !d.psClosed {
		_ = d.ps.Close()
	}
}
