-- lease_read: what a concurrency limiter holds, for inspect.
--
-- KEYS[1..4] T:sem, T:holders, T:queue, T:tickets
-- ARGV[1] holders to list, at most
--
-- Returns {} with no limit set; else {max, lease us, now us, waiting tickets, queued
-- permits (of the first SCAN, -1: more), holders as {id, expiry us, ...}}. Read-only.

local state = LEASE.load(KEYS[1])
if not state then
  return {}
end
local now = now_us()
local holders = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local queued = LEASE.ahead(KEYS[3], nil) or -1
return { state.max, state.lease, now, redis.call('ZCOUNT', KEYS[3], '(0', '+inf'), queued, holders }
