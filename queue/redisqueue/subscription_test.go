package redisqueue_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// namedClient returns a client of the test server whose connections are
// named name (CLIENT SETNAME), closed at cleanup.
func namedClient(t *testing.T, name string) *redis.Client {
	t.Helper()
	redistest.Client(t, 1) // skips or fails without a server, as redistest says
	opt := redistest.Options(t)
	opt.ClientName = name
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// subscribers returns the IDs of the server's pub/sub connections named
// name.
func subscribers(t *testing.T, c *redis.Client, name string) []int64 {
	t.Helper()
	list, err := c.ClientList(t.Context()).Result()
	require.NoError(t, err)
	var ids []int64
	for line := range strings.Lines(list) {
		f := map[string]string{}
		for kv := range strings.FieldsSeq(line) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		if f["name"] == name && strings.Contains(f["flags"], "P") {
			id, err := strconv.ParseInt(f["id"], 10, 64)
			require.NoError(t, err)
			ids = append(ids, id)
		}
	}
	return ids
}

// TestLostSubscriptionGivesGaps: when the server kills the driver's
// pub/sub connection, every subscriber gets a Gap and Ready fires; the
// driver subscribes again and changes flow.
func TestLostSubscriptionGivesGaps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin := redistest.Client(t, 2)
	prefix := redistest.Prefix(t, admin)
	name := "rq-" + prefix // names only this test's connections
	d := newDriver(t, namedClient(t, name), &redisqueue.Config{Prefix: prefix, PollInterval: time.Hour})
	q := queue.New(d)
	ch1, stop1, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop1()
	ch2, stop2, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop2()
	drainReady(q.Ready())

	ids := subscribers(t, admin, name)
	require.Len(t, ids, 1, "the driver's one pub/sub connection")
	require.NoError(t, admin.ClientKillByFilter(ctx, "ID", strconv.FormatInt(ids[0], 10)).Err())
	for i, ch := range []<-chan queue.Change{ch1, ch2} {
		c := nextChange(t, ch)
		assert.True(t, c.Gap, "subscriber %d: a lost subscription is a gap: %+v", i+1, c)
	}
	waitReady(t, q.Ready(), "after the subscription was lost")

	// go-redis subscribes again on the next receive; wait for the server
	// to count the subscription (polling the server, with a deadline).
	require.Eventually(t, func() bool {
		n, err := admin.PubSubNumSub(ctx, d.Channel()).Result()
		return err == nil && n[d.Channel()] == 1
	}, waitLimit, 5*time.Millisecond, "the driver subscribes again")
	assert.NotEqual(t, ids, subscribers(t, admin, name), "on a new connection")
	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	for i, ch := range []<-chan queue.Change{ch1, ch2} {
		assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 1}, nextChangeOf(t, ch, j.ID),
			"subscriber %d after the reconnection", i+1)
	}
}

// TestLostMessagesGiveGaps: when messages stop arriving without the
// subscription failing, the driver notices that its own pings do not
// come back and gives every subscriber a Gap within a few PollIntervals;
// when messages arrive again, changes flow.
func TestLostMessagesGiveGaps(t *testing.T) {
	t.Parallel()
	const poll = 25 * time.Millisecond
	c := redistest.Client(t, 4)
	d := newDriver(t, c, &redisqueue.Config{PollInterval: poll})
	q := queue.New(d)
	ctx := t.Context()
	ch1, stop1, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop1()
	ch2, stop2, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop2()

	d.DropMessages(true)
	start := time.Now()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	for i, ch := range []<-chan queue.Change{ch1, ch2} {
		c := nextChange(t, ch)
		require.True(t, c.Gap, "subscriber %d: lost messages are a gap: %+v", i+1, c)
	}
	// Two pings missing is the rule, three intervals or so; the bound is
	// loose for a loaded machine but far below any other timeout.
	assert.Less(t, time.Since(start), 40*poll, "the gap comes within a few PollIntervals")
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, queue.StateQueued, got.State, "what a watcher reads after the gap")

	d.DropMessages(false)
	k, err := q.Enqueue(ctx, queue.EnqueueParams{})
	require.NoError(t, err)
	for i, ch := range []<-chan queue.Change{ch1, ch2} {
		for {
			c := nextChange(t, ch)
			if c.JobID == k.ID {
				assert.Equal(t, queue.Change{JobID: k.ID, State: queue.StateQueued, Version: 1}, c, "subscriber %d", i+1)
				break
			}
			require.True(t, c.Gap, "subscriber %d: only gaps before: %+v", i+1, c)
		}
	}
}

// TestSilentSubscriptionReplaced: when the driver's pings stop coming
// back although the connection reports no error (a half-open TCP
// connection behaves so for minutes), the driver subscribes again on a
// new connection instead of waiting for TCP to notice.
func TestSilentSubscriptionReplaced(t *testing.T) {
	t.Parallel()
	const poll = 25 * time.Millisecond
	ctx := t.Context()
	admin := redistest.Client(t, 2)
	prefix := redistest.Prefix(t, admin)
	name := "rq-" + prefix
	d := newDriver(t, namedClient(t, name), &redisqueue.Config{Prefix: prefix, PollInterval: poll})
	q := queue.New(d)
	before := subscribers(t, admin, name)
	require.Len(t, before, 1)

	d.DropMessages(true) // the connection stays up, but nothing arrives
	require.Eventually(t, func() bool {
		now := subscribers(t, admin, name)
		return len(now) == 1 && now[0] != before[0]
	}, waitLimit, poll, "a new subscription, on a new connection")
	d.DropMessages(false)

	ch, stop, err := q.Subscribe(ctx, 16)
	require.NoError(t, err)
	defer stop()
	// The new subscription delivers. Pings lost before DropMessages(false)
	// still count, so on a loaded machine a ping that comes back late can
	// make the driver subscribe once more; what is published meanwhile is
	// lost and a Gap says so. A job enqueued then is tried again.
	for deadline := time.Now().Add(waitLimit); time.Now().Before(deadline); {
		j, err := q.Enqueue(ctx, queue.EnqueueParams{})
		require.NoError(t, err)
		if c, ok := changeOrGap(t, ch, j.ID); ok {
			assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 1}, c)
			return
		}
	}
	t.Fatalf("changes were still lost %v after the subscription was replaced", waitLimit)
}

// changeOrGap returns the next change of job id on ch, skipping other
// jobs' changes, or false at the first gap.
func changeOrGap(t *testing.T, ch <-chan queue.Change, id string) (queue.Change, bool) {
	t.Helper()
	for {
		c := nextChange(t, ch)
		if c.Gap {
			return c, false
		}
		if c.JobID == id {
			return c, true
		}
	}
}
