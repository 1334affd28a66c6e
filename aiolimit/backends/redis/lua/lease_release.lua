-- lease_release: the holder of a lease hands it back; idempotent (lease_lib.lua's
-- LEASE.release).
--
-- KEYS[1..4] T:sem, T:holders, T:queue, T:tickets
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
local reply = LEASE.release(state, KEYS, now_us(), ARGV[1], ARGV[2])
if state then
  LEASE.save(state)
end
return reply
