-- lease_cancel: a waiter that gave up (cancelled) takes its ticket out of the queue, or hands
-- back the lease granted to it meanwhile.
--
-- KEYS[1..5] T:sem, T:holders, T:queue, T:tickets, T:granted
-- ARGV[1] the ticket
--
-- The waiters behind it that now fit are granted. Returns 1 when the ticket was queued or
-- granted.

local ticket = ARGV[1]
local removed = redis.call('ZREM', KEYS[3], ticket)
redis.call('ZREM', KEYS[4], ticket)
local state = LEASE.load(KEYS[1])
if not state then
  return removed
end
if removed == 1 then
  LEASE.count_queued(state, -LEASE.permits(ticket))
end
local fence = redis.call('ZSCORE', KEYS[5], ticket)
if fence then
  redis.call('ZREM', KEYS[5], ticket)
  LEASE.drop_holder(state, KEYS, LEASE.permits(ticket) .. ':' .. format('%d', fence + 0))
  removed = 1
end
if removed == 1 then
  LEASE.promote(state, KEYS, now_us(), nil, nil)
  LEASE.save(state)
end
return removed
