package redisqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/comfypool/comfypool/pool"
)

// BackendLeases is a pool.BackendLeases in Redis: give the same one (or
// one on the same server and Prefix) to the Pools of every process
// (pool.Config.BackendLeases) and each backend is driven by one of them at
// a time, taken over by another when its holder dies and its lease
// expires. Expiry is judged by the Redis server's clock (TIME), so the
// processes' clocks need not agree.
//
// It is a pool.HolderRegistry too: the Pools on one Prefix know each
// other and each drives its fair share of the backends.
//
// Its keys, all in the hash slot of "{Prefix}" (so it runs on Redis
// Cluster too): "{Prefix}:bl:holder", a hash of backend name to holder;
// "{Prefix}:bl:expires", a sorted set of backend names by the end of their
// lease (Unix microseconds); "{Prefix}:holders", a sorted set of the
// announced holders by the end of their announcement. Each operation is
// one Lua script (Withdraw: one ZREM), atomic on the server.
//
// It is safe for concurrent use; it does not close the client.
type BackendLeases struct {
	c       redis.UniversalClient
	holder  string // key: backend -> holder
	expires string // key: backend by lease end
	holders string // key: holder by announcement end
	now     func() time.Time
}

// BackendLeasesConfig configures BackendLeases. The zero value is usable.
type BackendLeasesConfig struct {
	// Prefix names the keys: every key lives under "{Prefix}:". Pools
	// share backends when their BackendLeases have the same Prefix on the
	// same server. Defaults to DefaultPrefix ("comfypool").
	Prefix string
	// Test holds test-only knobs.
	Test BackendLeasesTestConfig
}

// BackendLeasesTestConfig holds test-only knobs of BackendLeases.
type BackendLeasesTestConfig struct {
	// Now, when set, replaces the Redis server's clock (TIME) in every
	// script.
	Now func() time.Time
}

// NewBackendLeases returns the backend leases kept in c's server. cfg may
// be nil for defaults; it is copied.
func NewBackendLeases(c redis.UniversalClient, cfg *BackendLeasesConfig) (*BackendLeases, error) {
	if c == nil {
		return nil, errors.New("redisqueue: NewBackendLeases: client is required")
	}
	var conf BackendLeasesConfig
	if cfg != nil {
		conf = *cfg
	}
	ns := keyNamespace(cmp.Or(conf.Prefix, DefaultPrefix))
	return &BackendLeases{
		c:       c,
		holder:  ns + "bl:holder",
		expires: ns + "bl:expires",
		holders: ns + "holders",
		now:     conf.Test.Now,
	}, nil
}

var (
	_ pool.BackendLeases  = (*BackendLeases)(nil)
	_ pool.HolderRegistry = (*BackendLeases)(nil)
)

// keyNamespace is the start of every key of prefix: "{prefix}:", one hash
// slot on Redis Cluster.
func keyNamespace(prefix string) string { return "{" + prefix + "}:" }

// clockArg is the script argument naming the clock: the test clock's time
// in Unix microseconds, or "" for the server's TIME (see luaClock).
func clockArg(now func() time.Time) string {
	if now == nil {
		return ""
	}
	return strconv.FormatInt(now().UnixMicro(), 10)
}

// luaClock defines now(arg) in a script: the test clock's time when arg
// is set (clockArg), else the server's TIME, in Unix microseconds (exact
// in a Lua number until the year 2255). Numbers are passed to
// redis.call as numbers, never concatenated: Lua 5.1 would print them
// with 14 digits.
const luaClock = `
local function now(arg)
	if arg ~= '' then return tonumber(arg) end
	local t = redis.call('TIME')
	return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
`

// acquireScript: KEYS holder, expires; ARGV backend, holder, ttl (µs),
// clock. It gives the lease to holder unless another holder's has not
// expired, and returns the lease as it stands: {holder, expires (µs)}.
// It also forgets a few expired leases, so that the keys do not keep
// every backend ever named.
var acquireScript = redis.NewScript(luaClock + `
local t = now(ARGV[4])
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', t, 'LIMIT', 0, 16)
for _, b in ipairs(old) do
	if b ~= ARGV[1] then
		redis.call('HDEL', KEYS[1], b)
		redis.call('ZREM', KEYS[2], b)
	end
end
local h = redis.call('HGET', KEYS[1], ARGV[1])
local e = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
if h and h ~= ARGV[2] and e > t then
	return {h, e}
end
local ends = t + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ends, ARGV[1])
return {ARGV[2], ends}
`)

// releaseScript: KEYS holder, expires; ARGV backend, holder. It deletes
// the lease when holder has it.
var releaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
	redis.call('HDEL', KEYS[1], ARGV[1])
	redis.call('ZREM', KEYS[2], ARGV[1])
end
return 0
`)

// listScript: KEYS holder, expires; ARGV clock. It returns the leases in
// force: {backend, holder, expires (µs), ...}.
var listScript = redis.NewScript(luaClock + `
local t = now(ARGV[1])
local bs = redis.call('ZRANGEBYSCORE', KEYS[2], string.format('(%.0f', t), '+inf', 'WITHSCORES')
local out = {}
for i = 1, #bs, 2 do
	local h = redis.call('HGET', KEYS[1], bs[i])
	if h then
		table.insert(out, bs[i])
		table.insert(out, h)
		table.insert(out, tonumber(bs[i + 1]))
	end
end
return out
`)

// announceScript: KEYS holders; ARGV holder, ttl (µs), clock. It records
// holder as alive until ttl from now, forgets the holders whose
// announcement ended, and returns the live ones.
var announceScript = redis.NewScript(luaClock + `
local t = now(ARGV[3])
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', t))
return redis.call('ZRANGE', KEYS[1], 0, -1)
`)

// Acquire implements pool.BackendLeases in one script: the lease is
// given to holder when it is free, expired or holder's already (renewed
// from now), else the current one is returned.
func (l *BackendLeases) Acquire(ctx context.Context, backend, holder string, ttl time.Duration) (pool.BackendLease, error) {
	op := fmt.Sprintf("acquire backend lease %q", backend)
	if ttl <= 0 {
		return pool.BackendLease{}, fmt.Errorf("redisqueue: %s: ttl must be positive", op)
	}
	res, err := acquireScript.Run(ctx, l.c, []string{l.holder, l.expires},
		backend, holder, max(ttl.Microseconds(), 1), clockArg(l.now)).Slice()
	if err != nil {
		return pool.BackendLease{}, wrapErr(op, err)
	}
	if len(res) != 2 {
		return pool.BackendLease{}, fmt.Errorf("redisqueue: %s: unexpected reply %v", op, res)
	}
	h, _ := res[0].(string)
	us, _ := res[1].(int64)
	return pool.BackendLease{Holder: h, Expires: time.UnixMicro(us)}, nil
}

// Release implements pool.BackendLeases: the lease is deleted when
// holder has it.
func (l *BackendLeases) Release(ctx context.Context, backend, holder string) error {
	err := releaseScript.Run(ctx, l.c, []string{l.holder, l.expires}, backend, holder).Err()
	return wrapErr(fmt.Sprintf("release backend lease %q", backend), err)
}

// List implements pool.HolderRegistry: the leases in force (unexpired, by
// the server's clock) by backend name, across every process on the
// Prefix.
func (l *BackendLeases) List(ctx context.Context) (map[string]pool.BackendLease, error) {
	const op = "list backend leases"
	res, err := listScript.Run(ctx, l.c, []string{l.holder, l.expires}, clockArg(l.now)).Slice()
	if err != nil {
		return nil, wrapErr(op, err)
	}
	if len(res)%3 != 0 {
		return nil, fmt.Errorf("redisqueue: %s: unexpected reply of %d values", op, len(res))
	}
	out := make(map[string]pool.BackendLease, len(res)/3)
	for i := 0; i < len(res); i += 3 {
		b, _ := res[i].(string)
		h, _ := res[i+1].(string)
		us, _ := res[i+2].(int64)
		out[b] = pool.BackendLease{Holder: h, Expires: time.UnixMicro(us)}
	}
	return out, nil
}

// Announce implements pool.HolderRegistry in one script: holder's
// announcement is recorded or moved to ttl from now (by the server's
// clock), the holders whose announcement ended are forgotten, and the
// live holders are returned.
func (l *BackendLeases) Announce(ctx context.Context, holder string, ttl time.Duration) ([]string, error) {
	op := fmt.Sprintf("announce lease holder %q", holder)
	if ttl <= 0 {
		return nil, fmt.Errorf("redisqueue: %s: ttl must be positive", op)
	}
	live, err := announceScript.Run(ctx, l.c, []string{l.holders},
		holder, max(ttl.Microseconds(), 1), clockArg(l.now)).StringSlice()
	if err != nil {
		return nil, wrapErr(op, err)
	}
	return live, nil
}

// Withdraw implements pool.HolderRegistry: holder's announcement is
// deleted.
func (l *BackendLeases) Withdraw(ctx context.Context, holder string) error {
	return wrapErr(fmt.Sprintf("withdraw lease holder %q", holder), l.c.ZRem(ctx, l.holders, holder).Err())
}
