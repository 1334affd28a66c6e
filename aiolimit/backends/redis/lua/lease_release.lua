-- lease_release: the holder of a lease hands it back; idempotent.
--
-- KEYS[1..5] T:sem, T:holders, T:queue, T:tickets, T:granted
-- ARGV[1] the lease id
-- ARGV[2] the caller's process (as in its tickets): its waiters granted now are answered here
--
-- Only the lease named is removed: an id names one lease for the limiter's life (its fence).
-- A second release, or one after the lease ended, frees nothing more. The waiters that now
-- fit are granted and handed their leases (lease_lib.lua's `wake`).
-- Returns {held, lease us, ticket, lease id, ticket, lease id, ...}: held 1 when the lease
-- was held until now, 0 when it had ended or was gone already (then nothing follows); then
-- the leases granted to the caller's process's waiters, by ticket.

local state = LEASE.load(KEYS[1])
if not state then
  return { 0 }
end
local now = now_us()
local expires = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not expires then
  return { 0 }
end
LEASE.drop_holder(state, KEYS, ARGV[1])
local reply = { expires + 0 > now and 1 or 0, state.lease }
LEASE.promote(state, KEYS, now, ARGV[2], reply)
LEASE.save(state)
return reply
