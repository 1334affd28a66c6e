-- expire: makes the whole limiter disappear after ttl (state keys that would expire
-- sooner keep their shorter TTL).
--
-- KEYS[1] config hash, KEYS[2] value key, KEYS[3] permits ZSET (OVERALL), KEYS[4] registry
-- ARGV[1] ttl in milliseconds
-- ARGV[2] now in microseconds, or '' to read the server's TIME
--
-- The end is also written into the config (`expires_at`), so that no grant made meanwhile
-- gives the state a TTL beyond it (nor slides a keep_alive past it). PER_CLIENT clients'
-- keys are given it by the caller, in chunks (refresh.lua).
--
-- Returns 1 when the config exists, 0 when it does not (nothing is changed).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local ttl = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'expires_at', fmt(now_us(ARGV[2]) + ttl * 1000))
redis.call('PEXPIRE', KEYS[1], ttl)
for i = 2, 4 do
  local current = redis.call('PTTL', KEYS[i])
  if current == -1 or current > ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return 1
