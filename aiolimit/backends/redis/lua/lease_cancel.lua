-- lease_cancel: a waiter that gave up (cancelled) takes its ticket out of the queue, or hands
-- back the lease granted to it meanwhile.
--
-- KEYS[1..4] T:sem, T:holders, T:queue, T:tickets
-- ARGV[1] the ticket
--
-- The waiters behind it that now fit are granted. Returns 1 when the ticket was queued or
-- granted.

local ticket = ARGV[1]
local place = redis.call('ZSCORE', KEYS[3], ticket)
if not place then
  return 0
end
redis.call('ZREM', KEYS[3], ticket)
local state = LEASE.load(KEYS[1])
if place + 0 > 0 then
  if state then
    LEASE.unstamp(state, KEYS, { ticket }, 1, 1)
    LEASE.count_queued(state, -LEASE.permits(ticket))
  else
    redis.call('ZREM', KEYS[4], ticket)
  end
elseif state then -- (granted in the queue: its lease goes back)
  LEASE.drop_holder(state, KEYS, LEASE.permits(ticket) .. ':' .. format('%d', -place))
end
if state then
  LEASE.promote(state, KEYS, now_us(), nil, nil)
  LEASE.save(state)
end
return 1
