package redisqueue_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/queue/redisqueue"
)

// scriptCalls returns how many times the server at c ran each of the
// commands that run Lua (INFO commandstats): fcall, evalsha and eval.
func scriptCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]int{}
	for line := range strings.Lines(info) {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd || (name != "fcall" && name != "evalsha" && name != "eval") {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		calls[name], err = strconv.Atoi(n)
		require.NoError(t, err, "%s", line)
	}
	return calls
}

// hasLibrary reports whether the server at c has the driver's library.
func hasLibrary(t *testing.T, c *redis.Client) bool {
	t.Helper()
	libs, err := c.FunctionList(t.Context(), redis.FunctionListQuery{LibraryNamePattern: redisqueue.LibraryName()}).Result()
	require.NoError(t, err)
	return len(libs) == 1
}

// TestFunctions: the driver loads its library on a server that has none
// and calls it, without a script; after FUNCTION FLUSH (or a restart of
// a Redis that keeps no data) it loads the library again, and the queue
// works on.
func TestFunctions(t *testing.T) {
	t.Parallel()
	addr := startRedis(t, func(port string) []string { return []string{"--port", port} })
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	require.False(t, hasLibrary(t, c))

	roundTrip(t, c)
	assert.True(t, hasLibrary(t, c), "the library is loaded")
	calls := scriptCalls(t, c)
	assert.Positive(t, calls["fcall"])
	assert.Zero(t, calls["evalsha"]+calls["eval"], "no script runs: %v", calls)

	require.NoError(t, c.FunctionFlush(t.Context()).Err())
	roundTrip(t, c)
	assert.True(t, hasLibrary(t, c), "the library is loaded again")
	calls = scriptCalls(t, c)
	assert.Zero(t, calls["evalsha"]+calls["eval"], "no script runs: %v", calls)
}

// TestNoFunctions: on a server without Functions (FCALL and FUNCTION
// unknown, as before Redis 7.0), the queue works through EVALSHA.
func TestNoFunctions(t *testing.T) {
	t.Parallel()
	addr := startRedis(t, func(port string) []string { return []string{"--port", port} },
		"--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	require.ErrorContains(t, c.Do(t.Context(), "FCALL", "f", 0).Err(), "unknown command", "the server has no FCALL")

	roundTrip(t, c)
	calls := scriptCalls(t, c)
	assert.Positive(t, calls["evalsha"], "%v", calls)
}

// TestFunctionsDenied: a user whose ACL denies FCALL and FUNCTION gets
// the queue through EVALSHA.
func TestFunctionsDenied(t *testing.T) {
	t.Parallel()
	addr := startRedis(t, func(port string) []string { return []string{"--port", port} })
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	password := secret(t)
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "nofn", "on", ">"+password, "~*", "&*", "+@all",
		"-fcall", "-function").Err())
	c := redis.NewClient(&redis.Options{Addr: addr, Username: "nofn", Password: password})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	require.ErrorContains(t, c.FCall(ctx, "f", nil).Err(), "NOPERM", "the user may not FCALL")

	roundTrip(t, c)
	assert.False(t, hasLibrary(t, admin))
	calls := scriptCalls(t, admin)
	assert.Positive(t, calls["evalsha"], "%v", calls)
}
