-- workflows: ARGV[3] "put" key body: stores body under key unless one is
-- stored, and refreshes the key's stored time; "purge" before: deletes
-- the bodies no retained job references, stored before the time, and
-- returns how many.
entries.workflows = function(KEYS, ARGV)
  start(ARGV)
  if ARGV[3] == 'put' then
    redis.call('SET', P .. 'w:' .. ARGV[4], ARGV[5], 'NX')
    redis.call('ZADD', P .. 'wt', NOW, ARGV[4])
    return 1
  end
  local keys = redis.call('ZRANGEBYSCORE', P .. 'wt', '-inf', '(' .. ARGV[4])
  local n = 0
  for _, key in ipairs(keys) do
    local refs = tonumber(redis.call('HGET', P .. 'wkref', key) or '0')
    if refs <= 0 then
      n = n + redis.call('DEL', P .. 'w:' .. key)
      redis.call('ZREM', P .. 'wt', key)
    end
  end
  return n
end
