-- tick: applies due transitions (up to ARGV[3] of each kind) and returns
-- {applied, next due time or 0, queued jobs, the time now}.
entries.tick = function(KEYS, ARGV)
  start(ARGV)
  local n = due(ARGV[3])
  publish()
  return { n, fmt(nextDue()), redis.call('ZCARD', P .. 's:queued'), fmt(NOW) }
end
