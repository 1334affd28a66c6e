-- lease_cancel: a waiter that gave up (cancelled) takes its ticket out of the queue.
--
-- KEYS[1] T:sem, KEYS[2] T:queue, KEYS[3] T:tickets
-- ARGV[1] the ticket
--
-- The waiters behind it that now fit are woken. Returns 1 when the ticket was queued.

local removed = redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local state = LEASE.load(KEYS[1])
if removed == 1 and state then
  LEASE.wake(state, KEYS[2])
end
return removed
