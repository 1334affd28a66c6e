-- lease_take: one attempt at a lease, in FIFO order (lease_lib.lua's LEASE.take).
--
-- KEYS[1..5] T:sem, T:holders, T:queue, T:tickets, T:granted
-- ARGV[1] permits
-- ARGV[2] the caller's ticket "<permits>:<process>:<id>[:p|:h]"
-- ARGV[3] how long the caller will wait (us): 0 gives up now (its ticket is dropped), -1
--         waits without end; a ticket left in the queue lives at most one lease, and each
--         call of its waiter stamps it again
--
-- Granted: the lease the ticket was granted in the queue, if its waiter asks before it was
-- handed over (or its wake-up was lost): collected, and renewed; or a new one when nobody
-- waits and the permits fit. Otherwise the ticket is queued (or stays).
-- Returns {0, lease id, lease us} granted; {1, retry us (-1: no holder), free, permits ahead
-- (-1: too many to count), lease us} not now; {-1} no limit set; {-2, max} over the limit.
-- Several attempts and releases made together go as one lease_many call.

local state = LEASE.load(KEYS[1])
local reply = LEASE.take(state, KEYS, now_us(), tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]))
if state then
  LEASE.save(state)
end
return reply
