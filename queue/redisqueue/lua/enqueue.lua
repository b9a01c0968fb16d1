-- enqueue: a batch of new jobs, all or nothing. ARGV[3] is the capacity
-- (0: unbounded), ARGV[4] the number of jobs, then per job the fields
-- id, priority, workflow, workflow key, overrides, payload, metadata,
-- requires, needs, excluded backends, idempotency key, max attempts,
-- settle ("1" for a job whose end is settled: field se).
-- It returns {"ok"} (with ARGV[3] "1", {"ok", record} of the first
-- job, as it was stored) or, for the first job refused in batch order,
-- {"dup", index, existing id}, {"notfound", index} or {"full", index}
-- (index from 0; for "full" the room there was). A job's key is checked
-- before the room, as memqueue does: a resubmission learns that its job
-- exists even when the queue is full.

-- unpack takes a bounded number of values: write the sets in chunks.
local function zadd(key, list)
  for i = 1, #list, 2000 do
    redis.call('ZADD', key, unpack(list, i, math.min(i + 1999, #list)))
  end
end

entries.enqueue = function(KEYS, ARGV)
  start(ARGV)
  local cap, n, want = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
  local F = 13
  local room = n
  if cap > 0 then
    room = cap - (redis.call('ZCARD', P .. 's:queued') + redis.call('ZCARD', P .. 's:leased') +
      redis.call('ZCARD', P .. 's:retrying'))
    if room < 0 then room = 0 end
  end
  for j = 0, n - 1 do
    local b = 5 + j * F
    local ik, wk = ARGV[b + 11], ARGV[b + 4]
    if ik ~= '' then
      local other = redis.call('HGET', P .. 'idem', ik)
      if other then return { 'dup', j, other } end
    end
    if wk ~= '' and redis.call('EXISTS', P .. 'w:' .. wk) == 0 then return { 'notfound', j } end
    if j >= room then return { 'full', room } end
  end

  local last = tonumber(redis.call('GET', P .. 'lastenq') or '0')
  local eq = NOW
  if eq < last then eq = last end
  redis.call('SET', P .. 'lastenq', fmt(eq))
  local seq = redis.call('INCRBY', KEYS[1], n) - n
  local first = seq + 1 -- the first job's sequence
  local eqs = fmt(eq)
  local optional = { [4] = 'wk', [5] = 'ov', [6] = 'pl', [7] = 'md', [8] = 'rq', [9] = 'nd', [10] = 'xb', [11] = 'ik',
    [13] = 'se' }
  -- A batch's jobs mostly share a bucket: each distinct one is named and
  -- stored once per batch, and its sorted sets are written in one command
  -- each.
  local bids = {}   -- definition -> bucket id
  local queued = {} -- bucket id -> {seq, id, seq, id, ...}
  local all = {}    -- {seq, id, ...}
  local refs = {}   -- workflow key -> jobs
  for j = 0, n - 1 do
    local b = 5 + j * F
    local id = ARGV[b + 1]
    seq = seq + 1
    local def = bucketDef(ARGV[b + 3], ARGV[b + 2], ARGV[b + 8], ARGV[b + 9], ARGV[b + 10])
    local bid = bids[def]
    if not bid then
      bid = redis.sha1hex(def)
      bids[def] = bid
      redis.call('HSET', P .. 'bk', bid, def)
      queued[bid] = {}
    end
    local f = { 'id', id, 'st', 'queued', 'v', 1, 'pr', ARGV[b + 2], 'wf', ARGV[b + 3], 'mx', ARGV[b + 12],
      'u', 0, 'eq', eqs, 'av', eqs, 'sq', seq, 'bk', bid }
    -- Empty fields are not written (readers default them): a smaller
    -- record is cheaper to read back on every lease.
    for o, name in pairs(optional) do
      local v = ARGV[b + o]
      if v ~= '' and (o < 8 or o > 10 or v ~= '[]') then -- an empty set is "[]"
        f[#f + 1] = name
        f[#f + 1] = v
      end
    end
    redis.call('HSET', jk(id), unpack(f))
    if ARGV[b + 11] ~= '' then redis.call('HSET', P .. 'idem', ARGV[b + 11], id) end
    local wk = ARGV[b + 4]
    if wk ~= '' then refs[wk] = (refs[wk] or 0) + 1 end
    local q = queued[bid]
    q[#q + 1] = seq
    q[#q + 1] = id
    all[#all + 1] = seq
    all[#all + 1] = id
    changed(id, 'queued', 1)
  end
  for bid, q in pairs(queued) do
    zadd(P .. 'q:' .. bid, q)
    redis.call('ZADD', P .. 'live', -tonumber(ARGV[5 + (q[1] - first) * F + 2]), bid)
  end
  zadd(P .. 's:queued', all)
  zadd(P .. 'all', all)
  for wk, c in pairs(refs) do redis.call('HINCRBY', P .. 'wkref', wk, c) end
  publish()
  if want then return { 'ok', pack(record(ARGV[6])) } end
  return { 'ok' }
end

