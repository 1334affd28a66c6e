-- The core of a concurrency limiter's scripts (lease_*.lua): its state, the reclaiming of
-- expired holders and tickets, and the waking of the waiters that now fit. Every function is
-- in the one table LEASE (a script's chunk has few locals to spare).
--
-- The keys, all under the limiter's hash tag T (aiolimit/backends/redis/_keys.py), passed to
-- every script in this order as KEYS[1..5]:
--   T:sem      HASH  max (slots), lease (us), fence (the last fence given), seq (the last
--                    ticket's place), used (slots the holders take), expires_at (ms, when
--                    expire() set one)
--   T:holders  ZSET  lease id "<permits>:<fence>" -> when it expires (us, server time)
--   T:queue    ZSET  ticket "<permits>:<process>:<id>" -> its place in the queue (seq)
--   T:tickets  ZSET  ticket -> when it is dropped unless its waiter calls again (us)
--   T:granted  ZSET  ticket -> the fence of the lease granted to it while it waited, until its
--                    waiter collects it (the lease id is "<ticket's permits>:<fence>")
--   T:wake:<process>  LIST  tickets of that process just granted, for its waker's BLPOP
-- Times are the server's TIME: no client clock is read. A fence is max(last + 1, now in us):
-- it only grows while the server's clock does not go back past its own earlier readings, even
-- when every key is lost (FLUSHALL, a restart without persistence), as the next fence given is
-- at least the time it is given at.
--
-- FIFO: whenever slots are free, the tickets at the head of the queue are granted in order
-- (`promote`), as many as fit; a head that does not fit stops it, so a 2-permit waiter is not
-- passed by 1-permit arrivals, and a newcomer is granted at once only when nobody waits. A
-- waiter granted so is woken through its process's wake list and collects its lease (a collect
-- renews it); one that never collects (killed) holds it until its lease ends, like any holder.
-- Every loop is bounded: RECLAIM holders, tickets or grants reclaimed per call, SCAN tickets
-- promoted or read ahead of a caller.

local LEASE = { RECLAIM = 100, SCAN = 100, WAKE_TTL_MS = 60000 }

function LEASE.load(sem_key)
  local f = redis.call('HMGET', sem_key, 'max', 'lease', 'fence', 'seq', 'used', 'expires_at')
  if not f[1] then
    return nil
  end
  return {
    key = sem_key,
    tag = string.sub(sem_key, 1, -5), -- without ':sem'
    max = tonumber(f[1]),
    lease = tonumber(f[2]),
    fence = tonumber(f[3] or '0'),
    seq = tonumber(f[4] or '0'),
    used = tonumber(f[5] or '0'),
    expires_at = f[6] and tonumber(f[6]) or nil,
  }
end

function LEASE.permits(member)
  return tonumber(string.match(member, '^(%d+):'))
end

-- A key written by this call lives no longer than the limiter (expire()).
function LEASE.bound(state, key)
  if state.expires_at then
    redis.call('PEXPIREAT', key, string.format('%d', state.expires_at))
  end
end

-- Drops holders whose lease has ended (at most RECLAIM); how many.
function LEASE.reclaim_holders(state, holders_key, now)
  local expired = redis.call('ZRANGEBYSCORE', holders_key, '-inf', string.format('%d', now),
    'LIMIT', 0, LEASE.RECLAIM)
  for _, id in ipairs(expired) do
    LEASE.drop_holder(state, holders_key, id)
  end
  return #expired
end

-- Removes a holder and its slots; whether it was there. `used` never goes below 0: only a
-- holder that was there gives its permits back.
function LEASE.drop_holder(state, holders_key, id)
  if redis.call('ZREM', holders_key, id) == 0 then
    return false
  end
  state.used = math.max(0, state.used - LEASE.permits(id))
  state.dirty = true
  return true
end

-- Drops tickets whose waiter stopped calling (at most RECLAIM); how many.
function LEASE.reclaim_tickets(queue_key, tickets_key, now)
  local expired = redis.call('ZRANGEBYSCORE', tickets_key, '-inf', string.format('%d', now),
    'LIMIT', 0, LEASE.RECLAIM)
  if #expired > 0 then
    redis.call('ZREM', tickets_key, unpack(expired))
    redis.call('ZREM', queue_key, unpack(expired))
  end
  return #expired
end

-- The permits of the tickets ahead of place `seq` (all tickets: seq nil), or nil when more
-- than SCAN are ahead (the caller's turn is not near).
function LEASE.ahead(queue_key, seq)
  local tickets
  if seq then
    tickets = redis.call('ZRANGEBYSCORE', queue_key, '-inf', '(' .. seq, 'LIMIT', 0, LEASE.SCAN + 1)
  else
    tickets = redis.call('ZRANGE', queue_key, 0, LEASE.SCAN)
  end
  if #tickets > LEASE.SCAN then
    return nil
  end
  local permits = 0
  for _, ticket in ipairs(tickets) do
    permits = permits + LEASE.permits(ticket)
  end
  return permits
end

-- Grants the tickets at the head of the queue, in order, while they fit in the free slots;
-- each is woken through its process's wake list.
function LEASE.promote(state, keys, now)
  local free = state.max - state.used
  if free <= 0 then
    return
  end
  local lease_ends = string.format('%d', now + state.lease)
  for _, ticket in ipairs(redis.call('ZRANGE', keys[3], 0, LEASE.SCAN - 1)) do
    local permits = LEASE.permits(ticket)
    if permits > free then
      break
    end
    free = free - permits
    local fence = LEASE.grant(state, keys, permits, lease_ends, now)
    redis.call('ZREM', keys[3], ticket)
    redis.call('ZREM', keys[4], ticket)
    redis.call('ZADD', keys[5], fence, ticket)
    LEASE.bound(state, keys[5])
    local list = state.tag .. ':wake:' .. string.match(ticket, '^%d+:([^:]+):')
    redis.call('LPUSH', list, ticket)
    redis.call('PEXPIRE', list, LEASE.WAKE_TTL_MS)
  end
end

-- A new holder of `permits`, its lease ending at `lease_ends` (text); its fence, as text.
function LEASE.grant(state, keys, permits, lease_ends, now)
  state.fence = math.max(state.fence + 1, now)
  state.used = state.used + permits
  state.dirty = true
  local fence = string.format('%d', state.fence)
  redis.call('ZADD', keys[2], lease_ends, permits .. ':' .. fence)
  LEASE.bound(state, keys[2])
  return fence
end

-- Drops grants nobody collected within a lease (their leases have ended: a fence is at least
-- the time it was given at); at most RECLAIM.
function LEASE.reclaim_granted(state, keys, now)
  local stale = redis.call('ZRANGEBYSCORE', keys[5], '-inf', string.format('(%d', now - state.lease),
    'LIMIT', 0, LEASE.RECLAIM)
  if #stale > 0 then
    redis.call('ZREM', keys[5], unpack(stale))
  end
end

-- Reclaims what has ended (holders, tickets, grants) and grants the head of the queue.
function LEASE.tidy(state, keys, now)
  LEASE.reclaim_holders(state, keys[2], now)
  LEASE.reclaim_tickets(keys[3], keys[4], now)
  LEASE.reclaim_granted(state, keys, now)
  LEASE.promote(state, keys, now)
end

function LEASE.save(state)
  if state.dirty then
    redis.call('HSET', state.key, 'used', string.format('%d', state.used), 'fence',
      string.format('%d', state.fence), 'seq', string.format('%d', state.seq))
  end
end

-- Microseconds until the earliest holder's lease ends (-1: no holder).
function LEASE.next_expiry(holders_key, now)
  local first = redis.call('ZRANGE', holders_key, 0, 0, 'WITHSCORES')
  if #first == 0 then
    return -1
  end
  return math.max(0, tonumber(first[2]) - now)
end
