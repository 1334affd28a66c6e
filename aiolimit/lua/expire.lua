-- expire: makes the whole limiter disappear after ttl (state keys that would expire
-- sooner keep their shorter TTL).
--
-- KEYS as for delete.lua
-- ARGV[1] ttl in milliseconds
-- ARGV[2..] every client id in the registry
--
-- Returns 1 when the config exists, 0 when it does not (nothing is changed), -1 when the
-- registry names a client missing from ARGV.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if not registry_covered(KEYS[4], 2) then
  return -1
end
local ttl = tonumber(ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
for i = 2, #KEYS do
  local current = redis.call('PTTL', KEYS[i])
  if current == -1 or current > ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return 1
