-- lease_lifetime: deletes a concurrency limiter, or sets or clears its expiry.
--
-- KEYS[1..4] T:sem, T:holders, T:queue, T:tickets
-- ARGV[1] 'delete', 'expire' or 'persist'; ARGV[2] the ttl (ms) for 'expire'
--
-- 'expire' writes the end into T:sem (expires_at), so keys made later do not outlive it.
-- Returns 1 when the limiter was set (for 'persist': had an expiry), else 0.

local exists = redis.call('EXISTS', KEYS[1]) == 1
if ARGV[1] == 'delete' then
  redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
  return exists and 1 or 0
end
if not exists then
  return 0
end
if ARGV[1] == 'expire' then
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'expires_at', string.format('%d', at))
  for i = 1, 4 do
    redis.call('PEXPIREAT', KEYS[i], string.format('%d', at))
  end
  return 1
end
local had = redis.call('HDEL', KEYS[1], 'expires_at')
for i = 1, 4 do
  redis.call('PERSIST', KEYS[i])
end
return had
