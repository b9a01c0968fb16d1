package pgqueue

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/comfypool/comfypool/queue"
)

// connectListener opens the listener's own connection (outside the
// pool, which stays the user's) and LISTENs on the schema's channel.
func (d *Driver) connectListener(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, d.db.Config().ConnConfig.Copy())
	if err != nil {
		return nil, d.wrap("listen", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{d.channel}.Sanitize()); err != nil {
		closeListener(conn)
		return nil, d.wrap("listen", err)
	}
	return conn, nil
}

func closeListener(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// listen delivers notifications until ctx ends, reconnecting (with
// backoff) when the connection is lost; after a reconnection every
// subscriber gets a Gap (notifications may have been missed) and Ready
// fires.
func (d *Driver) listen(ctx context.Context, conn *pgx.Conn) {
	defer func() {
		if conn != nil {
			closeListener(conn)
		}
	}()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err == nil {
			if !d.dropNotes.Load() {
				d.dispatch(n.Payload)
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		d.log.WarnContext(ctx, "pgqueue: listener connection lost; reconnecting", "error", err)
		closeListener(conn)
		conn = nil
		for backoff := 50 * time.Millisecond; conn == nil; backoff = min(2*backoff, 5*time.Second) {
			timer := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			cctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
			conn, err = d.connectListener(cctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				d.log.WarnContext(ctx, "pgqueue: listener reconnect failed", "error", err)
			}
		}
		d.log.InfoContext(ctx, "pgqueue: listener reconnected")
		d.feed.Gap()
		d.signalReady()
		d.wake()
	}
}

// dispatch handles one notification: comma-separated "id:state:version"
// entries for job changes (one statement's, in order: see
// migrations/001_queue.sql), "ping:..." for the check that
// notifications arrive, "resume" for a resumed pause scope.
func (d *Driver) dispatch(payload string) {
	if rest, ok := strings.CutPrefix(payload, "ping:"); ok {
		id, n, _ := strings.Cut(rest, ":")
		if v, err := strconv.ParseUint(n, 10, 64); err == nil && id == d.pingID && v > d.pingSeen.Load() {
			d.pingSeen.Store(v)
		}
		return
	}
	var ready, wake bool
	for entry := range strings.SplitSeq(payload, ",") {
		id, rest, ok1 := strings.Cut(entry, ":")
		state, ver, ok2 := strings.Cut(rest, ":")
		v, err := strconv.ParseUint(ver, 10, 64)
		if !ok1 || !ok2 || err != nil {
			ready = true // "resume", or anything unknown: a wake-up may be spurious
			continue
		}
		c := queue.Change{JobID: id, State: queue.State(state), Version: v}
		switch c.State {
		case queue.StateQueued:
			ready = true
		case queue.StateRetrying, queue.StateLeased:
			wake = true // a new due time, maybe the next
		}
		d.feed.Publish(c)
	}
	if ready {
		d.signalReady()
	}
	if wake {
		d.wake()
	}
}

// Subscribe implements [queue.Watcher] with a [queue.Feed]: changes made
// by any process on the schema, from the notifications of its commits.
// When the listener loses its connection, the subscriber gets a Gap once
// it is back.
func (d *Driver) Subscribe(ctx context.Context, buffer int) (<-chan queue.Change, func(), error) {
	if err := d.check(ctx); err != nil {
		return nil, nil, err
	}
	// Close closes the feed only after d.closed: a Subscribe racing it
	// gets a channel that Close closes.
	ch, stop := d.feed.Subscribe(buffer)
	return ch, stop, nil
}

// maintain applies due transitions when they fall due (a timer on the
// next retry delay or lease expiry, as the database's clock tells), so
// that expired leases are taken back, Ready fires and subscribers hear of
// it even when no call is made; every process on the queue does this
// (SKIP LOCKED keeps them apart). A notification of a lease or a retry
// delay may bring the next due time closer: it wakes the loop to look
// again, at most every kickSpacing. Every PollInterval it also applies
// due transitions, fires Ready when queued jobs exist (in case
// notifications were lost) and sweeps retention.
func (d *Driver) maintain(ctx context.Context) {
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	due := time.NewTimer(0) // what fell due while no process ran
	defer due.Stop()
	spacing := time.NewTimer(0)
	defer spacing.Stop()
	var kick <-chan struct{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			d.poll(ctx)
			due.Reset(d.applyDue(ctx))
		case <-due.C:
			due.Reset(d.applyDue(ctx))
		case <-spacing.C:
			kick = d.kick
		case <-kick:
			if next, ok := d.nextDue(ctx); ok {
				due.Reset(next)
			}
			kick = nil
			spacing.Reset(kickSpacing)
		}
	}
}

// kickSpacing is the least time between two looks at the next due time
// prompted by notifications.
const kickSpacing = 20 * time.Millisecond

// applyDue applies the due transitions and returns the time to the next
// one (at most PollInterval).
func (d *Driver) applyDue(ctx context.Context) time.Duration {
	var n int64
	if err := d.db.QueryRow(ctx, d.q.due, d.now()).Scan(&n); err != nil {
		d.logErr(ctx, "apply due transitions", err)
		return d.cfg.PollInterval
	}
	if n > 0 {
		d.signalReady()
	}
	next, _ := d.nextDue(ctx)
	return next
}

// nextDue returns the time to the next due transition, at most
// PollInterval, and false on error.
func (d *Driver) nextDue(ctx context.Context) (time.Duration, bool) {
	var us *int64
	if err := d.db.QueryRow(ctx, d.q.nextDue, d.now()).Scan(&us); err != nil {
		d.logErr(ctx, "next due time", err)
		return d.cfg.PollInterval, false
	}
	if us == nil {
		return d.cfg.PollInterval, true
	}
	return min(max(time.Duration(*us)*time.Microsecond, 5*time.Millisecond), d.cfg.PollInterval), true
}

// poll is the fallback for lost notifications, and the retention sweep.
// It fires Ready when queued jobs exist. And it checks that notifications
// arrive: each poll sends this driver a ping through the channel; when
// one has not come back two polls later, notifications are
// being lost (a transaction-mode pooler between the listener and the
// server, say), so every subscriber gets a Gap (re-read what you follow),
// each PollInterval until pings come back.
func (d *Driver) poll(ctx context.Context) {
	var queued bool
	if err := d.db.QueryRow(ctx, d.q.queuedExists).Scan(&queued); err != nil {
		d.logErr(ctx, "poll", err)
	} else if queued {
		d.signalReady()
	}
	if sent := d.pingSent.Load(); sent > 1 {
		// The ping before last had a whole interval to come back.
		lost := d.pingSeen.Load() < sent-1
		if lost {
			d.feed.Gap()
			d.signalReady()
		}
		if lost != d.notesLost {
			d.notesLost = lost
			if lost {
				d.log.WarnContext(ctx, "pgqueue: notifications are not arriving; subscribers get a gap every poll interval")
			} else {
				d.log.InfoContext(ctx, "pgqueue: notifications arrive again")
			}
		}
	}
	n := d.pingSent.Add(1)
	if _, err := d.db.Exec(ctx, `SELECT pg_notify($1, $2)`, d.channel, "ping:"+d.pingID+":"+strconv.FormatUint(n, 10)); err != nil {
		d.pingSent.Store(n - 1) // no ping went out: nothing to miss
		d.logErr(ctx, "ping", err)
	}
	if d.cfg.Retention > 0 {
		if _, err := d.db.Exec(ctx, d.q.retention, d.now(), d.cfg.Retention.Microseconds()); err != nil {
			d.logErr(ctx, "retention sweep", err)
		}
	}
}

func (d *Driver) logErr(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	d.log.WarnContext(ctx, "pgqueue: "+what, "error", err)
}
