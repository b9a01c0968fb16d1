package redisqueue

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/queue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestWrapErrRealErrors classifies errors that real parts give: replies
// of the test server (a script answering with an error), a closed port,
// a server that hangs or hangs up, a closed client, a cancelled call.
func TestWrapErrRealErrors(t *testing.T) {
	t.Parallel()
	if wrapErr("op", nil) != nil {
		t.Fatal("wrapErr(op, nil) != nil")
	}

	redistest.Client(t, 1) // skips or fails without a server, as redistest says
	// A client that does not retry, so each error comes back as it is.
	opt := redistest.Options(t)
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	reply := func(msg string) error {
		err := c.Eval(t.Context(), "return redis.error_reply(ARGV[1])", nil, msg).Err()
		if err == nil {
			t.Fatalf("a script replying %q gave no error", msg)
		}
		return err
	}
	nilErr := c.Get(t.Context(), "{"+redistest.Prefix(t, c)+"}:missing").Err()
	if !errors.Is(nilErr, redis.Nil) {
		t.Fatalf("GET of a missing key: %v, want redis.Nil", nilErr)
	}

	tests := []struct {
		name      string
		err       error
		retryable bool
	}{
		{"LOADING", reply("LOADING Redis is loading the dataset in memory"), true},
		{"TRYAGAIN", reply("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{"CLUSTERDOWN", reply("CLUSTERDOWN The cluster is down"), true},
		{"MASTERDOWN", reply("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{"READONLY", reply("READONLY You can't write against a read only replica."), true},
		{"ERR", reply("ERR something else"), false},
		{"WRONGTYPE", reply("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"OOM", reply("OOM command not allowed when used memory > 'maxmemory'."), false},
		{"script error", c.Eval(t.Context(), "return redis.call('NOSUCHCOMMAND')", nil).Err(), false},
		{"redis.Nil", nilErr, false},
		{"refused", refused(t), true},
		{"timeout", hanging(t, false), true},
		{"hung up", hanging(t, true), true},
		{"closed client", closedClient(t), false},
		{"cancelled", cancelled(t, c), false},
		{"deadline", context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err == nil {
				t.Fatal("no error to classify")
			}
			got := wrapErr("dag: load execution \"e\"", tt.err)
			if queue.IsRetryable(got) != tt.retryable {
				t.Errorf("wrapErr(%v): retryable %v, want %v", tt.err, queue.IsRetryable(got), tt.retryable)
			}
			if !errors.Is(got, tt.err) {
				t.Errorf("wrapErr(%v) = %v, which does not wrap it", tt.err, got)
			}
			if want := "redisqueue: dag: load execution \"e\": " + tt.err.Error(); got.Error() != want {
				t.Errorf("wrapErr = %q, want %q", got, want)
			}
		})
	}
}

// refused is the error of a call to a closed port.
func refused(t *testing.T) error {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	err := c.Ping(t.Context()).Err()
	var ne net.Error
	if !errors.As(err, &ne) {
		t.Fatalf("Ping of a closed port: %v, want a net.Error", err)
	}
	return err
}

// hanging is the error of a call to a server that reads the command and
// then never answers (a read timeout) or, with hangUp, closes the
// connection (EOF or a reset).
func hanging(t *testing.T, hangUp bool) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 512)
				_, _ = conn.Read(buf)
				if hangUp {
					_ = conn.Close()
				}
				_, _ = io.Copy(io.Discard, conn) // until closed
			})
		}
	})
	c := redis.NewClient(&redis.Options{
		Addr: ln.Addr().String(), MaxRetries: -1, ReadTimeout: 100 * time.Millisecond,
		DisableIdentity: true, Protocol: 2, // no HELLO nor CLIENT SETINFO first
	})
	defer c.Close()
	err = c.Get(t.Context(), "k").Err()
	if err == nil {
		t.Fatal("a server that never answers gave no error")
	}
	if !hangUp {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("a server that never answers: %v, want a timeout", err)
		}
	} else if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("a server that hangs up: %v, want EOF or a reset", err)
	}
	return err
}

// closedClient is the error of a call to a closed client.
func closedClient(t *testing.T) error {
	c := redis.NewClient(redistest.Options(t))
	_ = c.Close()
	err := c.Ping(t.Context()).Err()
	if !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Ping of a closed client: %v, want redis.ErrClosed", err)
	}
	return err
}

// cancelled is the error of a call whose context was cancelled.
func cancelled(t *testing.T, c *redis.Client) error {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := c.Ping(ctx).Err()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Ping with a cancelled context: %v, want context.Canceled", err)
	}
	return err
}
