-- pause: ARGV[3] the scope ("a", "w:<workflow>" or "t:<tag>"), ARGV[4]
-- "1" to pause, "0" to resume (which wakes every driver).
entries.pause = function(KEYS, ARGV)
  start(ARGV)
  if ARGV[4] == '1' then
    redis.call('SADD', P .. 'paused', ARGV[3])
  elseif redis.call('SREM', P .. 'paused', ARGV[3]) == 1 then
    wake = true
  end
  publish()
  return 1
end
