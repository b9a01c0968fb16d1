-- reconcile: repairs what Redis trouble (a failover losing writes, an
-- eviction, a hand edit) can leave, looking only at the leased jobs and
-- the lease records. From offset ARGV[3] it examines up to ARGV[4]
-- entries of an index: with ARGV[5] "jobs" the leased index, where a job
-- marked leased without a lease record (an orphan) has its lease voided
-- as if it expired now, and an entry whose job is gone or not leased is
-- dropped; with "records" the lease records, where a record whose job
-- is gone or not leased is dropped.
-- It returns {orphans recovered, next offset, done}.
entries.reconcile = function(KEYS, ARGV)
  start(ARGV)
  local records = ARGV[5] == 'records'
  local index = P .. 's:leased'
  if records then index = P .. 'lease' end
  local ids = redis.call('ZRANGE', index, ARGV[3], tonumber(ARGV[3]) + tonumber(ARGV[4]) - 1)
  local n, offset = 0, tonumber(ARGV[3])
  for _, id in ipairs(ids) do
    local f = redis.call('HMGET', jk(id), 'st', 'le')
    if records then
      if f[1] == 'leased' then
        offset = offset + 1
      else
        redis.call('ZREM', P .. 'lease', id)
      end
    elseif not f[1] then
      redis.call('ZREM', P .. 's:leased', id)
      redis.call('ZREM', P .. 'lease', id)
    elseif f[1] ~= 'leased' then
      redis.call('ZREM', P .. 's:leased', id)
    elseif not redis.call('ZSCORE', P .. 'lease', id) then
      if f[2] then redis.call('HSET', jk(id), 'le', fmt(NOW)) end
      expire(id, NOW)
      n = n + 1
    else
      offset = offset + 1
    end
  end
  local done = 0
  if #ids < tonumber(ARGV[4]) then done = 1 end
  publish()
  return { n, offset, done }
end
