-- The shared part of every script of the driver. The Go side builds two
-- things of these files (buildLib in scripts.go): one Redis Functions
-- library of this file and every script's (a script's file adds its
-- entry point to entries, and the library registers each), loaded once
-- and called with FCALL, and, for a Redis without Functions, one EVAL
-- script per entry point, this file, the entry's file and a call of the
-- entry. So that a call runs no definitions, everything is defined at
-- load: the functions below keep the state of a call in the upvalues
-- that start sets at the beginning of every call (Redis runs one call at
-- a time).
--
-- Every entry is called with KEYS[1] = the queue's sequence key (for
-- routing on Redis Cluster: every key of a queue shares its hash tag),
-- ARGV[1] = the key prefix ("{prefix}:") and ARGV[2] = the time in
-- microseconds since the epoch to use, or "" for the server's clock.
-- Times are integers of microseconds, written with fmt (a Lua number
-- prints as 1.8e+15 otherwise).
--
-- A job is the hash P.."j:"..id; its fields are listed in record.go.

local entries = {} -- the entry points by script name

-- The state of a call (start).
local P     -- the key prefix
local NOW   -- the time (µs)
local NOWS  -- NOW as a string
local TAG   -- the caller's tag (see publish)
local numstrs, changes, wake, liveCache

-- The queue's keys, made once per prefix: P .. name makes a new Lua
-- string each time, and the hot path names the same few keys for every
-- job. keyP is the prefix they were made for, qkeys the buckets' keys
-- (per call: the buckets come and go).
local keyP, keys, qkeys
local function K(name)
  local k = keys[name]
  if not k then
    k = P .. name
    keys[name] = k
  end
  return k
end
local function qk(bid)
  local k = qkeys[bid]
  if not k then
    k = P .. 'q:' .. bid
    qkeys[bid] = k
  end
  return k
end
local stateKeys = { queued = 's:queued', leased = 's:leased', retrying = 's:retrying', completed = 's:completed',
  dead = 's:dead', cancelled = 's:cancelled' }
local function sk(st) return K(stateKeys[st] or ('s:' .. st)) end

local function fmt(n) return string.format('%.0f', n) end

-- numstr is fmt remembered for the call: a Lua number becomes a string
-- through sprintf, which costs more than most commands, and a group
-- writes the same few numbers (now, versions, lengths) many times.
-- Scripts pass strings, not numbers, to redis.call for the same reason.
local function numstr(n)
  local s = numstrs[n]
  if not s then
    s = fmt(n)
    numstrs[n] = s
  end
  return s
end

-- start sets the state of a call from its ARGV: ARGV[2] is the time to
-- use (or "") and, after a "|", the caller's tag.
local function start(ARGV)
  P = ARGV[1]
  local nowArg
  nowArg, TAG = string.match(ARGV[2], '^([^|]*)|?(.*)$')
  if nowArg ~= '' then
    NOW = tonumber(nowArg)
  else
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  numstrs, changes, wake, liveCache, qkeys = {}, {}, false, nil, {}
  if P ~= keyP then keyP, keys = P, {} end
  NOWS = numstr(NOW)
end

local function jk(id) return P .. 'j:' .. id end

-- Changes written by this script, published at its end as one message
-- ("c", the caller's tag, "|", then "id:state:version" entries,
-- comma-separated; several messages for many changes, the tag on the
-- last); a "w" message asks every driver to fire Ready (work may have
-- become leasable without a job becoming queued: a resume, a cancel).
-- A caller that tags its call waits until its own subscription has
-- delivered the tagged message, so the message goes out even with no
-- change.
local function changed(id, st, v)
  changes[#changes + 1] = id .. ':' .. st .. ':' .. v
end
local function publish()
  if wake then redis.call('PUBLISH', K('ch'), 'w') end
  if #changes == 0 and TAG == '' then return end
  -- Bounded messages: a subscriber's buffer is per message.
  for i = 1, math.max(#changes, 1), 200 do
    local last = i + 199 >= #changes
    local tag = ''
    if last then tag = TAG end
    redis.call('PUBLISH', K('ch'), 'c' .. tag .. '|' .. table.concat(changes, ',', i, math.min(i + 199, #changes)))
  end
end

local function bump(id) return redis.call('HINCRBY', jk(id), 'v', 1) end

-- The state indexes: one sorted set per state, by enqueue sequence.
local function move(id, seq, from, to)
  if from then redis.call('ZREM', sk(from), id) end
  redis.call('ZADD', sk(to), seq, id)
end

-- JSON arrays of strings (sets): cjson writes an empty table as {}.
local function encodeList(t)
  if #t == 0 then return '[]' end
  return cjson.encode(t)
end

-- The bucket of a queued job: one per distinct combination of the
-- routing properties, holding its queued jobs by age.
local function bucketDef(wf, pr, rq, nd, xb)
  return '[' .. cjson.encode(wf) .. ',' .. pr .. ',' .. rq .. ',' .. nd .. ',' .. xb .. ']'
end

-- The buckets that hold queued jobs are the sorted set live, by
-- priority, highest first (score -priority), so that a lease looks at
-- the buckets of lower priority only when no higher one serves it. A
-- call reads it once (liveBuckets) until it adds or drops a bucket.
local function liveBuckets()
  if not liveCache then liveCache = redis.call('ZRANGE', K('live'), 0, -1) end
  return liveCache
end

-- makeQueued puts a job (whose fields st, v are already written) into its
-- bucket and the queued index.
local function makeQueued(id, from)
  local f = redis.call('HMGET', jk(id), 'wf', 'pr', 'rq', 'nd', 'xb', 'sq')
  local def = bucketDef(f[1], f[2], f[3] or '[]', f[4] or '[]', f[5] or '[]')
  local bid = redis.sha1hex(def)
  redis.call('HSET', K('bk'), bid, def)
  redis.call('HSET', jk(id), 'bk', bid)
  redis.call('ZADD', qk(bid), f[6], id)
  redis.call('ZADD', K('live'), -tonumber(f[2]), bid)
  liveCache = nil
  move(id, f[6], from, 'queued')
end

-- dropBucket forgets an empty bucket: its definition is written again
-- when a job enters it, so that buckets do not pile up.
local function dropBucket(bid)
  redis.call('ZREM', K('live'), bid)
  redis.call('HDEL', K('bk'), bid)
  liveCache = nil
end

local function unbucket(id)
  local bid = redis.call('HGET', jk(id), 'bk')
  if bid then
    redis.call('ZREM', qk(bid), id)
    if redis.call('ZCARD', qk(bid)) == 0 then dropBucket(bid) end
  end
end

-- Attempts: the field "at" holds the closed attempts and "ao" the open
-- one, if any, each a run of length-prefixed fields ("<len>:<bytes>",
-- which needs no escaping and no JSON): an open attempt has its backend,
-- prompt id and start; a closed one adds its end, class, the error's
-- class, message, node id and node type, and "1" when it counted.
local function lp(s) return numstr(#s) .. ':' .. s end

-- backendOf returns the first field of an attempt: its backend.
local function backendOf(ao)
  local c = string.find(ao, ':', 1, true)
  return string.sub(ao, c + 1, c + tonumber(string.sub(ao, 1, c - 1)))
end

-- closed returns the "at" field with the open attempt ao (or, when make
-- is set and none is open, one for the lease of backend lb begun at la)
-- closed at time at, with class, the error summary e ({c, m, n, t}) and
-- counted, and the attempt's backend; nil when nothing was closed.
local function closed(raw, ao, lb, la, at, class, e, counted, make)
  if not ao then
    if not make then return nil end
    ao = lp(lb or '') .. '0:' .. lp(la or '0')
  end
  local rec = ao .. lp(numstr(at)) .. lp(class)
  if e then
    rec = rec .. lp(e.c) .. lp(e.m) .. lp(e.n) .. lp(e.t)
  else
    rec = rec .. '0:0:0:0:'
  end
  if counted then rec = rec .. '1:1' else rec = rec .. '0:' end
  return (raw or '') .. rec, backendOf(ao)
end

-- closeAttempt is closed on the job's record, written back; counted
-- also counts it against the job's attempts.
local function closeAttempt(id, at, class, e, counted, make)
  local k = jk(id)
  local f = redis.call('HMGET', k, 'at', 'ao', 'lb', 'la')
  local list, b = closed(f[1], f[2], f[3], f[4], at, class, e, counted, make)
  if not list then return nil end
  if counted then redis.call('HINCRBY', k, 'u', 1) end
  redis.call('HSET', k, 'at', list)
  redis.call('HDEL', k, 'ao')
  return b
end

local function setError(id, e)
  redis.call('HSET', jk(id), 'ec', e.c, 'em', e.m, 'en', e.n, 'et', e.t)
end

local function clearError(id)
  redis.call('HDEL', jk(id), 'ec', 'em', 'en', 'et')
end

-- ended indexes a job that just became terminal at time at: a job
-- enqueued with Settle (se) becomes unsettled (us), waiting in the sorted
-- set unsettled by finish time until Settle moves it to fin; any other
-- goes to fin at once. So Purge and retention, which walk fin, never see
-- an unsettled job. It returns the value of us ("1" or false). k is the
-- job's key, when the caller has it.
local function ended(id, se, at, k)
  if se == '1' then
    redis.call('HSET', k or jk(id), 'us', '1')
    redis.call('ZADD', K('unsettled'), numstr(at), id)
    return '1'
  end
  redis.call('ZADD', K('fin'), numstr(at), id)
  return false
end

-- finish makes a job terminal (its fields already written but fi).
local function finish(id, seq, from, to, at)
  redis.call('HSET', jk(id), 'st', to, 'fi', numstr(at))
  ended(id, redis.call('HGET', jk(id), 'se'), at)
  move(id, seq, from, to)
end

local leaseExpired = { c = 'lease_expired', m = 'queue: lease expired', n = '', t = '' }

-- expire voids the lease of a leased job that expired at time at: the
-- attempt counts, and the job is queued again or dead.
local function expire(id, at)
  local k = jk(id)
  redis.call('ZREM', K('lease'), id)
  closeAttempt(id, at, 'lease_expired', leaseExpired, true, true)
  redis.call('HDEL', k, 'tk', 'le')
  local f = redis.call('HMGET', k, 'u', 'mx', 'sq')
  local v = bump(id)
  if (tonumber(f[1]) or 0) >= (tonumber(f[2]) or 1) then
    setError(id, leaseExpired)
    finish(id, f[3], 'leased', 'dead', at)
    changed(id, 'dead', v)
    return
  end
  redis.call('HSET', k, 'st', 'queued', 'av', numstr(at))
  makeQueued(id, 'leased')
  changed(id, 'queued', v)
end

-- due applies the transitions that are due: expired leases and elapsed
-- retry delays, at most limit of each (a string, as redis.call takes
-- it: a number argument costs an sprintf; the maintenance loop does the
-- rest). It never looks at jobs that are not due.
local function due(limit)
  local exp = redis.call('ZRANGEBYSCORE', K('lease'), '-inf', NOWS, 'WITHSCORES', 'LIMIT', '0', limit)
  for i = 1, #exp, 2 do
    if redis.call('HGET', jk(exp[i]), 'st') == 'leased' then
      expire(exp[i], tonumber(exp[i + 1]))
    else
      redis.call('ZREM', K('lease'), exp[i]) -- a leftover (Redis trouble)
    end
  end
  local ready = redis.call('ZRANGEBYSCORE', K('retry'), '-inf', NOWS, 'LIMIT', '0', limit)
  for _, id in ipairs(ready) do
    redis.call('ZREM', K('retry'), id)
    if redis.call('HGET', jk(id), 'st') == 'retrying' then
      redis.call('HSET', jk(id), 'st', 'queued')
      local v = bump(id)
      makeQueued(id, 'retrying')
      changed(id, 'queued', v)
    end
  end
  return #exp / 2 + #ready
end

-- nextDue returns the time of the next due transition, or 0.
local function nextDue()
  local t = 0
  for _, z in ipairs({ 'lease', 'retry' }) do
    local h = redis.call('ZRANGE', P .. z, 0, 0, 'WITHSCORES')
    if #h > 0 then
      local s = tonumber(h[2])
      if t == 0 or s < t then t = s end
    end
  end
  return t
end

-- The job's record: its fields in the order of recordFields in
-- record.go (false for an absent one; all false when there is no job),
-- and R, their positions, so that a script that read a record can
-- return it as it wrote it without reading it again. Scripts return it
-- packed (pack). k is the job's key, when the caller has it.
local function record(id, k)
  return redis.call('HMGET', k or jk(id), 'id', 'st', 'v', 'pr', 'wf', 'wk', 'ov', 'pl', 'md', 'rq', 'nd', 'xb', 'ik',
    'mx', 'u', 'at', 'ao', 'eq', 'av', 'la', 'le', 'fi', 'lb', 'tk', 'rs', 'ec', 'em', 'en', 'et', 'sq', 'se', 'us')
end
local R = { id = 1, st = 2, v = 3, u = 15, at = 16, ao = 17, la = 20, le = 21, fi = 22, lb = 23, tk = 24, rs = 25,
  sq = 30, se = 31, us = 32 }

-- pack returns a record as the scripts return it: one JSON array of its
-- fields (strings, false when absent; decodeRow in record.go). Redis
-- turns a reply of 32 strings into 32 allocations on the client, and
-- cjson builds the one string in C for what Redis's own reply of 32
-- costs (a loop in Lua costs three times more).
local function pack(r) return cjson.encode(r) end
