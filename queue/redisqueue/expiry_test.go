package redisqueue_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// monitor records the commands the server runs (MONITOR: commands of
// clients and of scripts, the latter marked "[<db> lua]") that contain
// mark, from when startMonitor returns until stop.
type monitor struct {
	conn  net.Conn
	done  chan struct{}
	more  chan struct{} // a line was recorded (coalesced)
	mu    sync.Mutex
	lines []string
}

// startMonitor opens a connection to the server of opt and turns it into
// a MONITOR; it is closed at cleanup at the latest.
func startMonitor(t *testing.T, opt *redis.Options, mark string) *monitor {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	var conn net.Conn
	var err error
	if opt.TLSConfig != nil {
		conn, err = tls.DialWithDialer(d, "tcp", opt.Addr, opt.TLSConfig)
	} else {
		conn, err = d.Dial("tcp", opt.Addr)
	}
	require.NoError(t, err)
	rd := bufio.NewReader(conn)
	command := func(args ...string) {
		t.Helper()
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
		_, err := conn.Write([]byte(b.String()))
		require.NoError(t, err)
		reply, err := rd.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "+OK\r\n", reply, "%s", args[0])
		require.NoError(t, conn.SetDeadline(time.Time{}))
	}
	if opt.Password != "" {
		if opt.Username != "" {
			command("AUTH", opt.Username, opt.Password)
		} else {
			command("AUTH", opt.Password)
		}
	}
	if opt.DB != 0 {
		command("SELECT", fmt.Sprint(opt.DB))
	}
	command("MONITOR") // from its +OK on, every command is reported
	m := &monitor{conn: conn, done: make(chan struct{}), more: make(chan struct{}, 1)}
	go func() {
		defer close(m.done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return // closed by stop
			}
			if strings.Contains(line, mark) {
				m.mu.Lock()
				m.lines = append(m.lines, strings.TrimSpace(line))
				m.mu.Unlock()
				select {
				case m.more <- struct{}{}:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { m.stop() })
	return m
}

// waitFor waits until a recorded line contains s: the server feeds a
// monitor as it runs each command, but the test may hear of the command's
// effect through another connection first.
func (m *monitor) waitFor(t *testing.T, s string) {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for {
		m.mu.Lock()
		found := slices.ContainsFunc(m.lines, func(l string) bool { return strings.Contains(l, s) })
		m.mu.Unlock()
		if found {
			return
		}
		select {
		case <-m.more:
		case <-m.done:
			t.Fatalf("the monitor ended before a command with %q", s)
		case <-timer.C:
			t.Fatalf("the monitor saw no command with %q", s)
		}
	}
}

// stop ends the monitor and returns the lines it recorded.
func (m *monitor) stop() []string {
	_ = m.conn.Close()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lines
}

// TestExpiryWithoutSweep: with 10,000 jobs queued, a lease that expires
// is voided by the driver's timer, with no call of the test (it only
// waits on its subscription) and no poll (PollInterval is an hour); and
// the work the server does meanwhile (recorded with MONITOR) is a few
// commands that touch none of the queued jobs: no sweep.
func TestExpiryWithoutSweep(t *testing.T) {
	t.Parallel()
	const queued, lease = 10_000, 500 * time.Millisecond
	c := redistest.Client(t, 4)
	prefix := redistest.Prefix(t, c)
	q := queue.New(newDriver(t, c, &redisqueue.Config{Prefix: prefix, PollInterval: time.Hour}))
	ctx := t.Context()

	// Room for every change, so that a gap cannot hide the lease's.
	ch, stop, err := q.Subscribe(ctx, queued+64)
	require.NoError(t, err)
	defer stop()
	j, err := q.Enqueue(ctx, queue.EnqueueParams{Workflow: "w", Priority: 1})
	require.NoError(t, err)
	ids := make(map[string]bool, queued)
	for range queued / 2000 {
		batch, err := q.EnqueueBatch(ctx, make([]queue.EnqueueParams, 2000))
		require.NoError(t, err)
		for _, id := range batch {
			ids[id] = true
		}
	}

	mon := startMonitor(t, redistest.Options(t), "{"+prefix+"}")
	l, err := q.Lease(ctx, queue.LeaseParams{Backend: "b", Duration: lease})
	require.NoError(t, err)
	require.Equal(t, j.ID, l.ID, "the job of higher priority")
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 1}, nextChangeOf(t, ch, j.ID))
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateLeased, Version: 2}, nextChangeOf(t, ch, j.ID))
	assert.Equal(t, queue.Change{JobID: j.ID, State: queue.StateQueued, Version: 3}, nextChangeOf(t, ch, j.ID),
		"the expiry, applied by the driver's timer")
	mon.waitFor(t, j.ID+":queued:3") // the expiry's PUBLISH, the last command of its script but one
	lines := mon.stop()

	// The lines in groups: a client's command, then the commands of its
	// script, if any. Every group but the Lease's is maintenance.
	var groups [][]string
	for _, line := range lines {
		if !strings.Contains(line, " lua] ") || len(groups) == 0 {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], line)
	}
	var calls, commands int
	for _, g := range groups {
		for _, line := range g {
			for _, f := range strings.Fields(line) {
				f = strings.Trim(f, `"`)
				if ids[f[strings.LastIndexByte(f, ':')+1:]] {
					t.Fatalf("a command touched a queued job: %s", line)
				}
			}
		}
		if strings.Contains(g[0], `"lease" "b"`) {
			continue // the Lease: the ops script's call
		}
		calls++
		commands += len(g)
		for _, line := range g[1:] {
			if strings.Contains(strings.ToLower(line), `] "zrange`) {
				assert.Regexp(t, `}:(lease|retry)" `, line, "the maintenance reads a range of an index other than the due times")
			}
		}
	}
	assert.Positive(t, calls, "the maintenance ran")
	assert.Less(t, commands, 100, "the commands of the maintenance:\n%s", strings.Join(lines, "\n"))
	t.Logf("the maintenance: %d script calls, %d commands, with %d jobs queued", calls, commands, queued)

	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	assert.Equal(t, 1, got.AttemptsUsed)
	require.Len(t, got.Attempts, 1)
	assert.Equal(t, queue.ClassLeaseExpired, got.Attempts[0].Class)
}
