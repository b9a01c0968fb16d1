-- settle: claims unsettled jobs (queue.Settler.ClaimUnsettled). ARGV[3]
-- is the finish-time bound in µs ("" for none), ARGV[4] the claim in µs,
-- ARGV[5] the limit. It applies what is due first (a lease expiring with
-- its attempts used up makes a job unsettled), moves the claims that
-- lapsed from uclaim (by claim expiry) back to unsettled (by finish
-- time), then claims the oldest finished jobs of unsettled, up to the
-- limit, moving them to uclaim. It returns their records, oldest
-- finished first. A claim is no write of the record: no version, no
-- message.

entries.settle = function(KEYS, ARGV)
  start(ARGV)
  due('100')
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'uclaim', '-inf', NOW)) do
    redis.call('ZREM', P .. 'uclaim', id)
    local f = redis.call('HMGET', jk(id), 'us', 'fi')
    if f[1] == '1' then redis.call('ZADD', P .. 'unsettled', f[2], id) end
  end
  local max = '+inf'
  if ARGV[3] ~= '' then max = ARGV[3] end
  local limit = tonumber(ARGV[5])
  local untilT = NOW + tonumber(ARGV[4])
  local out = {}
  while #out < limit do
    local ids = redis.call('ZRANGEBYSCORE', P .. 'unsettled', '-inf', max, 'LIMIT', 0, limit - #out)
    if #ids == 0 then break end
    for _, id in ipairs(ids) do
      redis.call('ZREM', P .. 'unsettled', id)
      local r = record(id)
      if r[R.us] == '1' then
        redis.call('ZADD', P .. 'uclaim', untilT, id)
        out[#out + 1] = pack(r)
      end -- else a leftover of Redis trouble: dropped
    end
  end
  publish()
  return out
end
