-- lease_take: one attempt at a lease, in FIFO order (lease_lib.lua).
--
-- KEYS[1] T:sem, KEYS[2] T:holders, KEYS[3] T:queue, KEYS[4] T:tickets
-- ARGV[1] permits
-- ARGV[2] the caller's ticket "<permits>:<process>:<id>"
-- ARGV[3] how long the caller will wait (us): 0 gives up now (its ticket is dropped), -1
--         waits without end; a ticket the caller leaves in the queue lives at most one
--         lease, and each call of its waiter stamps it again
--
-- Granted when the ticket and every ticket ahead of it fit in the free slots together: the
-- ticket leaves the queue and the lease "<permits>:<fence>" joins the holders.
-- Returns {0, lease id, lease us} granted; {1, retry us (-1: no holder), free, permits ahead
-- (-1: too many to count), lease us} not now; {-1} no limit set; {-2, max} more permits than the limit.

local state = LEASE.load(KEYS[1])
if not state then
  return { -1 }
end
local permits, ticket, wait = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if permits > state.max then
  return { -2, state.max }
end
local now = now_us()
local freed = LEASE.reclaim_holders(state, KEYS[2], now) + LEASE.reclaim_tickets(KEYS[3], KEYS[4], now)
local seq = redis.call('ZSCORE', KEYS[3], ticket)
local ahead = LEASE.ahead(KEYS[3], seq)
local free = state.max - state.used
if ahead and ahead + permits <= free then
  state.fence = math.max(state.fence + 1, now)
  state.used = state.used + permits
  state.dirty = true
  local id = permits .. ':' .. string.format('%d', state.fence)
  redis.call('ZADD', KEYS[2], string.format('%d', now + state.lease), id)
  LEASE.bound(state, KEYS[2])
  if seq then
    redis.call('ZREM', KEYS[3], ticket)
    redis.call('ZREM', KEYS[4], ticket)
  end
  LEASE.save(state)
  if freed > 0 then
    LEASE.wake(state, KEYS[3])
  end
  return { 0, id, state.lease }
end
if wait == 0 then
  if seq then
    redis.call('ZREM', KEYS[3], ticket)
    redis.call('ZREM', KEYS[4], ticket)
    freed = freed + 1
  end
else
  if not seq then
    state.seq = state.seq + 1
    state.dirty = true
    redis.call('ZADD', KEYS[3], string.format('%d', state.seq), ticket)
    LEASE.bound(state, KEYS[3])
  end
  local keep = state.lease
  if wait > 0 and wait < keep then
    keep = wait
  end
  redis.call('ZADD', KEYS[4], string.format('%d', now + keep), ticket)
  LEASE.bound(state, KEYS[4])
end
LEASE.save(state)
if freed > 0 then
  LEASE.wake(state, KEYS[3])
end
return { 1, LEASE.next_expiry(KEYS[2], now), free, ahead or -1, state.lease }
