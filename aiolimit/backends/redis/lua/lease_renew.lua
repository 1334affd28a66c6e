-- lease_renew: the lease runs one more lease time from now, if its holder still has it.
--
-- KEYS[1..5] T:sem, T:holders, T:queue, T:tickets, T:granted
-- ARGV[1] the lease id
--
-- A lease that has ended (even one not reclaimed yet) is not renewed: it is dropped, and the
-- waiters it lets in are granted. A lease once lost is never given back.
-- Returns {0, lease us} renewed; {1} lost (no limit, no such holder, or it has ended).

local state = LEASE.load(KEYS[1])
if not state then
  return { 1 }
end
local now = now_us()
local expires = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not expires then
  return { 1 }
end
if tonumber(expires) <= now then
  LEASE.drop_holder(state, KEYS, ARGV[1])
  LEASE.promote(state, KEYS, now, nil, nil)
  LEASE.save(state)
  return { 1 }
end
redis.call('ZADD', KEYS[2], 'XX', string.format('%d', now + state.lease), ARGV[1])
local due = state.hdue
LEASE.lower_due(state, now + state.lease) -- (sooner than before after a lease time lowered)
if state.hdue ~= due then
  LEASE.save(state)
end
return { 0, state.lease }
