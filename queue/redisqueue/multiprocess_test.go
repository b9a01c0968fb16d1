package redisqueue_test

// The multi-process kill test (internal/killtest) on Redis: the processes
// share one key prefix, and the ledger is a hash under it.

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/internal/killtest"
	"github.com/comfypool/comfypool/queue/redisqueue"
	"github.com/comfypool/comfypool/queue/redisqueue/internal/redistest"
)

// TestKillOnePoolProcess runs the kill test (see killtest.Run) on a fresh
// key prefix: 3 pool processes, one SIGKILLed while it holds submitted
// prompts.
func TestKillOnePoolProcess(t *testing.T) {
	killtest.Run(t, killAdapter())
}

// killAdapter describes redisqueue to the kill test: the namespace is a
// key prefix (its keys deleted at cleanup); every process opens its own
// client.
func killAdapter() killtest.Adapter {
	return killtest.Adapter{
		Name: "redisqueue",
		Setup: func(t *testing.T) string {
			return redistest.Prefix(t, redistest.Client(t, 0))
		},
		Open: openKillParts,
	}
}

// openKillParts opens a client and builds every part over prefix;
// Parts.Close closes the failover and then the client.
func openKillParts(ctx context.Context, prefix string, log *slog.Logger) (_ *killtest.Parts, err error) {
	url, _ := redistest.URL()
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(opt)
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	drv, err := redisqueue.New(c, &redisqueue.Config{Prefix: prefix, Logger: log})
	if err != nil {
		return nil, err
	}
	leases, err := redisqueue.NewBackendLeases(c, &redisqueue.BackendLeasesConfig{Prefix: prefix})
	if err != nil {
		return nil, errors.Join(err, drv.Close())
	}
	store, err := redisqueue.NewDAGStore(c, &redisqueue.DAGStoreConfig{Prefix: prefix})
	if err != nil {
		return nil, errors.Join(err, drv.Close())
	}
	fo, err := redisqueue.NewFailover(ctx, c, &redisqueue.FailoverConfig{Prefix: prefix, Logger: log})
	if err != nil {
		return nil, errors.Join(err, drv.Close())
	}
	return &killtest.Parts{
		Driver:   drv,
		Leases:   leases,
		Failover: fo,
		DAGStore: store,
		Ledger:   &killLedger{c: c, key: "{" + prefix + "}:test_ledger"},
		Close: func(ctx context.Context) error {
			return errors.Join(fo.Close(ctx), c.Close())
		},
	}, nil
}

// killLedger is the kill test's ledger: a hash of "job<TAB>kind" to its
// count (HINCRBY is atomic).
type killLedger struct {
	c   *redis.Client
	key string
}

func (l *killLedger) Record(ctx context.Context, job, kind, holder string) error {
	return l.c.HIncrBy(ctx, l.key, job+"\t"+kind, 1).Err()
}

func (l *killLedger) Counts(ctx context.Context) (map[string]map[string]int, error) {
	m, err := l.c.HGetAll(ctx, l.key).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]int{}
	for k, v := range m {
		job, kind, ok := strings.Cut(k, "\t")
		if !ok {
			return nil, errors.New("malformed ledger entry " + k)
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, err
		}
		if out[job] == nil {
			out[job] = map[string]int{}
		}
		out[job][kind] = n
	}
	return out, nil
}
