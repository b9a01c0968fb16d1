// Package redistest gives each test of the redisqueue module a key prefix
// of its own on a real Redis server.
//
// The server is named by COMFYPOOL_REDIS_URL (a redis:// or rediss:// URL,
// as redis.ParseURL reads it); without it the tests try
// redis://127.0.0.1:6379/0. When that server cannot be reached, a test
// skips, saying so, unless COMFYPOOL_REDIS_URL or CI is set: then it
// fails, so that CI never passes without running them.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultURL is the server tried when COMFYPOOL_REDIS_URL is not set.
const DefaultURL = "redis://127.0.0.1:6379/0"

// URL returns the server's URL, and whether it was configured
// (COMFYPOOL_REDIS_URL or CI set).
func URL() (string, bool) {
	if u := os.Getenv("COMFYPOOL_REDIS_URL"); u != "" {
		return u, true
	}
	return DefaultURL, os.Getenv("CI") != ""
}

// Options returns the test server's options, skipping or failing the test
// when the URL does not parse.
func Options(t testing.TB) *redis.Options {
	t.Helper()
	url, _ := URL()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redistest: COMFYPOOL_REDIS_URL: %v", err)
	}
	return opt
}

// Client returns a client of the test server, closed at cleanup, skipping
// or failing the test when the server is not there (see the package doc).
// poolSize bounds its connections (0: go-redis's default).
func Client(t testing.TB, poolSize int) *redis.Client {
	t.Helper()
	_, configured := URL()
	opt := Options(t)
	if poolSize > 0 {
		opt.PoolSize = poolSize
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		if configured {
			t.Fatalf("redistest: Redis at %s: %v", opt.Addr, err)
		}
		t.Skipf("redistest: no Redis at %s (%v); set COMFYPOOL_REDIS_URL to run these tests", opt.Addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a new key prefix ("t_" and 12 hex digits) whose keys are
// deleted from c's server at cleanup. Adapters put every key of a queue
// under "{<prefix>}:", so that cleanup deletes the keys matching that.
func Prefix(t testing.TB, c *redis.Client) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := DeleteKeys(ctx, c, "{"+p+"}:*"); err != nil {
			t.Errorf("redistest: delete keys of prefix %s: %v", p, err)
		}
	})
	return p
}

// DeleteKeys deletes every key matching pattern (SCAN and UNLINK, in
// batches).
func DeleteKeys(ctx context.Context, c *redis.Client, pattern string) error {
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return c.Unlink(ctx, batch...).Err()
	}
	return nil
}
