-- lease_set: writes a concurrency limiter's limit and lease time.
--
-- KEYS[1..4] T:sem, T:holders, T:queue, T:tickets
-- ARGV[1] mode: 'try' (only where none is set), 'set', 'update' (only where one is)
-- ARGV[2] max in flight (slots), ARGV[3] lease (us)
--
-- The holders, the queue and the fence stay: a lower limit admits no one until the holders
-- are under it; a higher one grants the waiters that now fit.
-- Returns 1 written, 0 not.

local exists = redis.call('EXISTS', KEYS[1]) == 1
if (ARGV[1] == 'try' and exists) or (ARGV[1] == 'update' and not exists) then
  return 0
end
redis.call('HSET', KEYS[1], 'max', ARGV[2], 'lease', ARGV[3])
local state = LEASE.load(KEYS[1])
LEASE.tidy(state, KEYS, now_us())
LEASE.save(state)
return 1
