-- stats: the counts by state and the age of the oldest queued job.
entries.stats = function(KEYS, ARGV)
  start(ARGV)
  due('100')
  publish()
  local out = {}
  for _, st in ipairs({ 'queued', 'leased', 'retrying', 'completed', 'dead', 'cancelled' }) do
    out[#out + 1] = redis.call('ZCARD', P .. 's:' .. st)
  end
  local h = redis.call('ZRANGE', P .. 's:queued', 0, 0)
  local age = '0'
  if #h > 0 then
    local eq = redis.call('HGET', jk(h[1]), 'eq')
    if eq then age = fmt(NOW - tonumber(eq)) end
  end
  out[#out + 1] = age
  return out
end
