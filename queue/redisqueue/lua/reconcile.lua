-- reconcile: repairs what Redis trouble (a failover losing writes, an
-- eviction, a hand edit) can leave, looking only at the leased jobs:
-- from offset ARGV[3] it examines up to ARGV[4] entries of the leased
-- index; a job marked leased without a lease record (an orphan) has its
-- lease voided as if it expired now; an index entry whose job is gone is
-- dropped. It also drops lease records of jobs that are not leased.
-- It returns {orphans recovered, next offset, done}.
local ids = redis.call('ZRANGE', P .. 's:leased', ARGV[3], tonumber(ARGV[3]) + tonumber(ARGV[4]) - 1)
local n, offset = 0, tonumber(ARGV[3])
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', jk(id), 'st', 'le')
  if not f[1] then
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
