-- lease_release: the holder of a lease hands it back; idempotent.
--
-- KEYS[1..5] T:sem, T:holders, T:queue, T:tickets, T:granted
-- ARGV[1] the lease id
--
-- Only the lease named is removed: an id names one lease for the limiter's life (its fence).
-- A second release, or one after the lease ended, frees nothing more. The waiters that now
-- fit are granted.
-- Returns 1 when the lease was held until now, 0 when it had ended or was gone already.

local state = LEASE.load(KEYS[1])
if not state then
  return 0
end
local now = now_us()
local expires = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not expires then
  return 0
end
LEASE.drop_holder(state, KEYS[2], ARGV[1])
LEASE.promote(state, KEYS, now)
LEASE.save(state)
if tonumber(expires) <= now then
  return 0
end
return 1
