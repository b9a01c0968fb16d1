-- ops: a group of job operations, applied one after the other as if each
-- were its own call (see group.go). ARGV[3..] holds the operations, each
-- its name and then its fixed arguments. The result holds, for each, a
-- status ("ok", "none", "notfound", "lost", "invalid", "cancelled",
-- "full"), a detail (the job's state for "lost" and "invalid") and the
-- job's record when ok (or, for a complete with detail "d", the fields
-- it wrote: see complete).

local paused -- the paused scopes, read once per call
local function pausedSet()
  if not paused then
    paused = {}
    for _, s in ipairs(redis.call('SMEMBERS', K('paused'))) do paused[s] = true end
  end
  return paused
end

local none = {}
local sets -- JSON array -> its set, per call: a group's lessees often send the same
local function set(json)
  if json == '[]' then return none end
  local s = sets[json]
  if s then return s end
  s = {}
  for _, v in ipairs(cjson.decode(json)) do s[v] = true end
  sets[json] = s
  return s
end

-- meets reports whether the capability set has meets need (see
-- queue.Capabilities.Meets).
local function meets(has, need)
  if has[need] then return true end
  if string.sub(need, 1, 6) == 'value:' then
    local rest = string.sub(need, 7)
    local eq = string.find(rest, '=', 1, true)
    if eq and eq > 1 then return not has['list:' .. string.sub(rest, 1, eq - 1)] end
  end
  return false
end

local defs -- bucket id -> decoded definition {wf, priority, requires, needs, excludes}, per call
local function def(bid)
  local d = defs[bid]
  if not d then
    local raw = redis.call('HGET', K('bk'), bid)
    if not raw then return nil end -- lost (Redis trouble): skip the bucket
    d = cjson.decode(raw)
    defs[bid] = d
  end
  return d
end

local function eligible(d, r, ps)
  local wf = d[1]
  if r.wfs and not r.wfs[wf] then return false end
  if r.xwf[wf] or ps['w:' .. wf] then return false end
  for _, t in ipairs(d[3]) do
    if not r.tags[t] or ps['t:' .. t] then return false end
  end
  if r.has then
    for _, n in ipairs(d[4]) do
      if not meets(r.has, n) then return false end
    end
  end
  for _, b in ipairs(d[5]) do
    if b == r.backend then return false end
  end
  return true
end

local function seqOf(bid, id) return tonumber(redis.call('ZSCORE', qk(bid), id)) end

local function lease(backend, dur, tok, wfs, tags, has, xwf, pref)
  if wfs == '[]' then return { 'none' } end
  local ps = pausedSet()
  if ps['a'] then return { 'none' } end
  local r = { backend = backend, tags = set(tags), xwf = set(xwf), pref = set(pref) }
  if wfs ~= '' then r.wfs = set(wfs) end
  if has ~= '' then r.has = set(has) end
  -- The live buckets come by priority, highest first (the priority is
  -- the definition's, the same as the score): a bucket's head is read
  -- with the entry after it, which tells whether the lease empties it,
  -- and the heads' sequences only when two buckets of one priority
  -- compete.
  local best, bestBid, bestPr, bestPref, bestSeq, bestLast
  for _, bid in ipairs(liveBuckets()) do
    local d = def(bid)
    if d and best and d[2] < bestPr then break end -- lower priorities cannot win
    if d and eligible(d, r, ps) then
      local h = redis.call('ZRANGE', qk(bid), '0', '1')
      if #h == 0 then
        dropBucket(bid)
      else
        local pr, pf = d[2], r.pref[d[1]] == true
        local wins, sq = not best or pr > bestPr, nil
        if not wins and pr == bestPr then
          if pf ~= bestPref then
            wins = pf
          else
            bestSeq = bestSeq or seqOf(bestBid, best)
            sq = seqOf(bid, h[1])
            wins = sq < bestSeq
          end
        end
        if wins then
          best, bestBid, bestPr, bestPref, bestSeq, bestLast = h[1], bid, pr, pf, sq, #h == 1
        end
      end
    end
  end
  if not best then return { 'none' } end
  redis.call('ZREM', qk(bestBid), best)
  if bestLast then dropBucket(bestBid) end
  local k = jk(best)
  local rec = record(best, k)
  local st = rec[R.st]
  if st ~= 'queued' then
    -- An entry Redis trouble left (its job vanished, or is not queued):
    -- dropped, with the index entries of a vanished job; lease the next.
    if not st then
      redis.call('ZREM', K('s:queued'), best)
      redis.call('ZREM', K('all'), best)
    end
    return lease(backend, dur, tok, wfs, tags, has, xwf, pref)
  end
  -- One read and one write of the record (the hot path).
  local v = numstr((tonumber(rec[R.v]) or 0) + 1)
  local la, le = NOWS, numstr(NOW + tonumber(dur))
  redis.call('HSET', k, 'st', 'leased', 'tk', tok, 'la', la, 'le', le, 'lb', backend, 'v', v)
  redis.call('ZADD', K('lease'), le, best)
  move(best, rec[R.sq] or '0', 'queued', 'leased')
  changed(best, 'leased', v)
  rec[R.st], rec[R.tk], rec[R.la], rec[R.le], rec[R.lb], rec[R.v] = 'leased', tok, la, le, backend, v
  return { 'ok', '', pack(rec) }
end

-- checkLease checks that tok is the current lease of job id, given its
-- state, token and lease expiry, applying the expiry when it has
-- passed. It returns nil when it is, else the result to return.
local function checkLease(id, tok, st, tk, le)
  if not st then return { 'notfound' } end
  if st ~= 'leased' or tk ~= tok then return { 'lost', st } end
  le = tonumber(le) or NOW -- none (Redis trouble): void
  if le <= NOW then
    expire(id, le)
    return { 'lost', redis.call('HGET', jk(id), 'st') }
  end
  return nil
end

-- holder is checkLease on the job's record.
local function holder(id, tok)
  local f = redis.call('HMGET', jk(id), 'st', 'tk', 'le')
  return checkLease(id, tok, f[1], f[2], f[3])
end

local function errOf(c, m, n, t) return { c = c, m = m, n = n, t = t } end

local function extend(id, tok, dur)
  local bad = holder(id, tok)
  if bad then return bad end
  local exp = NOW + tonumber(dur)
  redis.call('HSET', jk(id), 'le', fmt(exp))
  redis.call('ZADD', K('lease'), exp, id)
  bump(id)
  return { 'ok', '', pack(record(id)) }
end

local function begin(id, tok, backend, prompt)
  local bad = holder(id, tok)
  if bad then return bad end
  local k = jk(id)
  closeAttempt(id, NOW, 'superseded', nil, false, false)
  if backend == '' then backend = redis.call('HGET', k, 'lb') end
  redis.call('HSET', k, 'ao', lp(backend) .. lp(prompt) .. lp(fmt(NOW)))
  changed(id, 'leased', bump(id))
  return { 'ok', '', pack(record(id)) }
end

-- complete reads only the fields it needs when the caller holds the
-- job's record as of version known (the Driver's copy from its Lease,
-- Extend or Begin), and then returns, when the job is still at that
-- version, only what it wrote (status "ok", detail "d": v, fi, at, u,
-- us): every write of a record bumps its version, so the caller's copy
-- and these make the record. Otherwise (known "", or another version)
-- it returns the record.
local function complete(id, tok, result, known)
  local k = jk(id)
  local rec, at, ao, lb, la, v, u, se, sq
  if known ~= '' then
    local f = redis.call('HMGET', k, 'st', 'tk', 'le', 'v', 'u', 'at', 'ao', 'lb', 'la', 'se', 'sq')
    local bad = checkLease(id, tok, f[1], f[2], f[3])
    if bad then return bad end
    v, u, at, ao, lb, la, se, sq = f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11]
  else
    rec = record(id, k)
    local bad = checkLease(id, tok, rec[R.st], rec[R.tk], rec[R.le])
    if bad then return bad end
    v, u, at, ao, lb, la, se, sq = rec[R.v], rec[R.u], rec[R.at], rec[R.ao], rec[R.lb], rec[R.la], rec[R.se], rec[R.sq]
  end
  -- One read and one write of the record (the hot path).
  local nat = closed(at, ao, lb, la, NOW, 'none', nil, true, true)
  local nv, nu, fi = numstr((tonumber(v) or 0) + 1), numstr((tonumber(u) or 0) + 1), NOWS
  redis.call('ZREM', K('lease'), id)
  redis.call('HDEL', k, 'tk', 'le', 'ao')
  redis.call('HSET', k, 'st', 'completed', 'fi', fi, 'rs', result, 'at', nat, 'u', nu, 'v', nv)
  local us = ended(id, se, NOW, k)
  move(id, sq, 'leased', 'completed')
  changed(id, 'completed', nv)
  if not rec then
    if v == known then return { 'ok', 'd', nv, fi, nat, nu, us or '' } end
    return { 'ok', '', pack(record(id, k)) }
  end
  rec[R.st], rec[R.fi], rec[R.rs], rec[R.at], rec[R.u], rec[R.v], rec[R.us] = 'completed', fi, result, nat, nu, nv, us
  rec[R.tk], rec[R.le], rec[R.ao] = false, false, false
  return { 'ok', '', pack(rec) }
end

local function setNeeds(id, needs)
  if needs ~= '' then redis.call('HSET', jk(id), 'nd', needs) end
end

local function fail(id, tok, c, m, n, t, retryAfter, noRetry, exclude, needs)
  local bad = holder(id, tok)
  if bad then return bad end
  local k = jk(id)
  redis.call('ZREM', K('lease'), id)
  local e = errOf(c, m, n, t)
  local backend = closeAttempt(id, NOW, c, e, true, true)
  if exclude == '1' and backend and backend ~= '' then
    local xb = cjson.decode(redis.call('HGET', k, 'xb') or '[]')
    local found = false
    for _, b in ipairs(xb) do if b == backend then found = true end end
    if not found then
      xb[#xb + 1] = backend
      table.sort(xb)
      redis.call('HSET', k, 'xb', encodeList(xb))
    end
  end
  setNeeds(id, needs)
  redis.call('HDEL', k, 'tk', 'le')
  local f = redis.call('HMGET', k, 'u', 'mx', 'sq')
  local v = bump(id)
  local ra = tonumber(retryAfter)
  if noRetry == '1' or (tonumber(f[1]) or 0) >= (tonumber(f[2]) or 1) then
    setError(id, e)
    finish(id, f[3], 'leased', 'dead', NOW)
    changed(id, 'dead', v)
  elseif ra > 0 then
    redis.call('HSET', k, 'st', 'retrying', 'av', fmt(NOW + ra))
    redis.call('ZADD', K('retry'), NOW + ra, id)
    move(id, f[3], 'leased', 'retrying')
    changed(id, 'retrying', v)
  else
    redis.call('HSET', k, 'st', 'queued', 'av', fmt(NOW))
    makeQueued(id, 'leased')
    changed(id, 'queued', v)
  end
  return { 'ok', '', pack(record(id)) }
end

local function requeue(id, tok, c, m, n, t, needs)
  local bad = holder(id, tok)
  if bad then return bad end
  local k = jk(id)
  redis.call('ZREM', K('lease'), id)
  closeAttempt(id, NOW, c, errOf(c, m, n, t), false, false)
  setNeeds(id, needs)
  redis.call('HDEL', k, 'tk', 'le')
  redis.call('HSET', k, 'st', 'queued', 'av', fmt(NOW))
  local v = bump(id)
  makeQueued(id, 'leased')
  changed(id, 'queued', v)
  return { 'ok', '', pack(record(id)) }
end

local function cancel(id, c, m, n, t)
  local k = jk(id)
  local st = redis.call('HGET', k, 'st')
  if not st then return { 'notfound' } end
  local e = errOf(c, m, n, t)
  if st == 'queued' then
    unbucket(id)
  elseif st == 'retrying' then
    redis.call('ZREM', K('retry'), id)
  elseif st == 'leased' then
    redis.call('ZREM', K('lease'), id)
    closeAttempt(id, NOW, 'cancelled', errOf('cancelled', m, n, t), false, false)
  elseif st == 'cancelled' then
    return { 'cancelled' }
  else
    return { 'invalid', st }
  end
  redis.call('HDEL', k, 'tk', 'le')
  setError(id, e)
  finish(id, redis.call('HGET', k, 'sq'), st, 'cancelled', NOW)
  changed(id, 'cancelled', bump(id))
  wake = true
  return { 'ok', '', pack(record(id)) }
end

local function unfinished()
  return redis.call('ZCARD', K('s:queued')) + redis.call('ZCARD', K('s:leased')) +
      redis.call('ZCARD', K('s:retrying'))
end

local function retry(id, capacity)
  local k = jk(id)
  local st = redis.call('HGET', k, 'st')
  if not st then return { 'notfound' } end
  if st ~= 'dead' and st ~= 'cancelled' then return { 'invalid', st } end
  local cap = tonumber(capacity)
  if cap > 0 and unfinished() >= cap then return { 'full' } end
  redis.call('HSET', k, 'st', 'queued', 'u', 0, 'av', fmt(NOW))
  redis.call('HDEL', k, 'fi', 'us')
  clearError(id)
  redis.call('ZREM', K('fin'), id)
  redis.call('ZREM', K('unsettled'), id)
  redis.call('ZREM', K('uclaim'), id)
  local v = bump(id)
  makeQueued(id, st)
  changed(id, 'queued', v)
  return { 'ok', '', pack(record(id)) }
end

local function get(id)
  local r = record(id)
  if not r[1] then return { 'notfound' } end
  return { 'ok', '', pack(r) }
end

-- settle clears the job's unsettled flag and claim, moving it to fin (a
-- write, announced to no one); a job that is not unsettled is returned
-- as it is, unwritten.
local function settle(id)
  local r = record(id)
  if not r[1] then return { 'notfound' } end
  if r[R.us] ~= '1' then return { 'ok', '', pack(r) } end
  redis.call('HDEL', jk(id), 'us')
  redis.call('ZREM', K('unsettled'), id)
  redis.call('ZREM', K('uclaim'), id)
  redis.call('ZADD', K('fin'), tonumber(r[R.fi]) or NOW, id)
  r[R.us], r[R.v] = false, tostring(bump(id))
  return { 'ok', '', pack(r) }
end

-- Each op runs protected: an error (a record Redis trouble left
-- malformed) fails that op alone; the writes it made before the error
-- stay, as Redis does not roll a script back, and the group goes on.
local ops = {
  get = { get, 1 }, lease = { lease, 8 }, extend = { extend, 3 }, begin = { begin, 4 },
  complete = { complete, 4 }, fail = { fail, 10 }, requeue = { requeue, 7 }, cancel = { cancel, 5 },
  retry = { retry, 2 }, settle = { settle, 1 },
}
entries.ops = function(KEYS, ARGV)
  start(ARGV)
  paused, defs, sets = nil, {}, {}
  due('100')
  local out = {}
  local i = 3
  while i <= #ARGV do
    local op = ops[ARGV[i]]
    if not op then
      publish()
      return redis.error_reply('redisqueue: unknown op ' .. tostring(ARGV[i]))
    end
    local ok, res = pcall(op[1], unpack(ARGV, i + 1, i + op[2]))
    if ok then
      out[#out + 1] = res
    else
      local msg = res
      if type(res) == 'table' then msg = res.err end
      out[#out + 1] = { 'error', tostring(msg) }
    end
    i = i + 1 + op[2]
  end
  publish()
  return out
end
