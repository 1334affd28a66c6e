-- lease_take: one attempt at a lease, in FIFO order (lease_lib.lua).
--
-- KEYS[1..5] T:sem, T:holders, T:queue, T:tickets, T:granted
-- ARGV[1] permits
-- ARGV[2] the caller's ticket "<permits>:<process>:<id>[:h]"
-- ARGV[3] how long the caller will wait (us): 0 gives up now (its ticket is dropped), -1
--         waits without end; a ticket left in the queue lives at most one lease, and each
--         call of its waiter stamps it again
--
-- Granted: the lease the ticket was granted in the queue, if its waiter asks before it was
-- handed over (or its wake-up was lost): collected, and renewed; or a new one when nobody
-- waits and the permits fit. Otherwise the ticket is queued (or stays).
-- Returns {0, lease id, lease us} granted; {1, retry us (-1: no holder), free, permits ahead
-- (-1: too many to count), lease us} not now; {-1} no limit set; {-2, max} over the limit.

local state = LEASE.load(KEYS[1])
if not state then
  return { -1 }
end
local permits, ticket, wait = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if permits > state.max then
  return { -2, state.max }
end
local now = now_us()
local earliest, empty = LEASE.tidy(state, KEYS, now)
local fence = redis.call('ZSCORE', KEYS[5], ticket)
if fence then
  redis.call('ZREM', KEYS[5], ticket)
  local id = permits .. ':' .. format('%d', fence + 0)
  local lease_ends = format('%d', now + state.lease)
  if redis.call('ZADD', KEYS[2], 'XX', 'CH', lease_ends, id) == 1 or redis.call('ZSCORE', KEYS[2], id) then
    LEASE.save(state)
    return { 0, id, state.lease }
  end -- (its lease ended before its waiter came for it: the ticket queues again, at the end)
end
local free = state.max - state.used
if empty and permits <= free then -- (nobody waits: the ticket is not queued either)
  local id = permits .. ':' .. LEASE.grant(state, KEYS, permits, format('%d', now + state.lease), now)
  LEASE.save(state)
  return { 0, id, state.lease }
end
local ahead = -1
if wait == 0 then
  if not empty and redis.call('ZREM', KEYS[3], ticket) == 1 then
    redis.call('ZREM', KEYS[4], ticket)
    LEASE.count_queued(state, -permits)
    local _, granted = LEASE.promote(state, KEYS, now, nil, nil) -- (it may have been a head that did not fit)
    if granted > 0 and not earliest then
      earliest = now + state.lease
    end
  end
else
  local seq = state.seq + 1
  if redis.call('ZADD', KEYS[3], 'NX', format('%d', seq), ticket) == 1 then
    ahead = state.queued -- (at the end: every ticket queued is ahead)
    state.seq = seq
    LEASE.count_queued(state, permits)
    LEASE.bound(state, KEYS[3])
  else -- (queued already: stamped again)
    ahead = LEASE.ahead(KEYS[3], redis.call('ZSCORE', KEYS[3], ticket)) or -1
  end
  local keep = state.lease
  if wait > 0 and wait < keep then
    keep = wait
  end
  redis.call('ZADD', KEYS[4], format('%d', now + keep), ticket)
  LEASE.bound(state, KEYS[4])
end
LEASE.save(state)
local retry = earliest and math.max(0, earliest - now) or -1
return { 1, retry, free, ahead, state.lease }
