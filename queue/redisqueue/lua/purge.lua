-- purge: deletes terminal jobs that finished before ARGV[3] ("" for no
-- bound), in the states of ARGV[4] (a JSON array), oldest finished
-- first, examining at most ARGV[5] jobs from offset ARGV[6] of the
-- finished index and deleting at most ARGV[7]. It returns {deleted,
-- skipped (the offset for the next call), done (1 when the index is
-- exhausted)}.
entries.purge = function(KEYS, ARGV)
  start(ARGV)
  local states = {}
  for _, s in ipairs(cjson.decode(ARGV[4])) do states[s] = true end
  local max = '+inf'
  if ARGV[3] ~= '' then max = '(' .. ARGV[3] end
  local examine, offset, limit = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local ids = redis.call('ZRANGEBYSCORE', P .. 'fin', '-inf', max, 'LIMIT', offset, examine)
  local deleted = 0
  for _, id in ipairs(ids) do
    if deleted >= limit then return { deleted, offset, 0 } end
    local k = jk(id)
    local f = redis.call('HMGET', k, 'st', 'ik', 'wk', 'us')
    if not f[1] then
      redis.call('ZREM', P .. 'fin', id) -- a leftover
    elseif states[f[1]] and f[4] ~= '1' then -- never an unsettled job (none is in fin)
      if f[2] and f[2] ~= '' and redis.call('HGET', P .. 'idem', f[2]) == id then
        redis.call('HDEL', P .. 'idem', f[2])
      end
      if f[3] and f[3] ~= '' and redis.call('HINCRBY', P .. 'wkref', f[3], -1) <= 0 then
        redis.call('HDEL', P .. 'wkref', f[3])
      end
      redis.call('DEL', k)
      redis.call('ZREM', P .. 'fin', id)
      redis.call('ZREM', P .. 'all', id)
      redis.call('ZREM', P .. 's:' .. f[1], id)
      deleted = deleted + 1
    else
      offset = offset + 1
    end
  end
  local done = 0
  if #ids < examine then done = 1 end
  return { deleted, offset, done }
end
