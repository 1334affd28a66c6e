-- expire: makes the whole limiter disappear after ttl (state keys that would expire
-- sooner keep their shorter TTL).
--
-- KEYS as for delete.lua
-- ARGV[1] ttl in milliseconds
-- ARGV[2] now in microseconds, or '' to read the server's TIME
-- ARGV[3..] every client id in the registry
--
-- The end is also written into the config (`expires_at`), so that no grant made meanwhile
-- gives the state a TTL beyond it (nor slides a keep_alive past it).
--
-- Returns 1 when the config exists, 0 when it does not (nothing is changed), -1 when the
-- registry names a client missing from ARGV.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if not registry_covered(KEYS[4], 3) then
  return -1
end
local ttl = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'expires_at', fmt(now_us(ARGV[2]) + ttl * 1000))
redis.call('PEXPIRE', KEYS[1], ttl)
for i = 2, #KEYS do
  local current = redis.call('PTTL', KEYS[i])
  if current == -1 or current > ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return 1
