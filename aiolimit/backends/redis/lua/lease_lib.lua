-- The core of a concurrency limiter's scripts (lease_*.lua): its state, the reclaiming of
-- expired holders and tickets, and the hand-over of freed slots to the waiters that now fit.
-- Every function is in the one table LEASE (a script's chunk has few locals to spare).
--
-- The keys, all under the limiter's hash tag T (aiolimit/backends/redis/_keys.py), passed to
-- every script in this order as KEYS[1..4]:
--   T:sem      HASH  max (slots), lease (us), fence (the last fence given), seq (the last
--                    ticket's place), used (slots the holders take), queued (permits of the
--                    tickets in T:queue), stamped (how many tickets T:tickets holds),
--                    expires_at (ms, when expire() set one); hdue (us: no holder's lease
--                    ends before it) as of fence hfence, tdue (us: no ticket is dropped
--                    before it) as of seq tseq
--   T:holders  ZSET  lease id "<permits>:<fence>" -> when it expires (us, server time)
--   T:queue    ZSET  ticket "<permits>:<process>:<id>[:p|:h]" -> its place in the queue: when
--                    it was queued (us, and after every earlier place: max(seq + 1, now)); or,
--                    once granted while it waited, minus the fence of its lease, as long as
--                    that lease is held and its waiter has not asked for it (the lease id is
--                    "<ticket's permits>:<fence>"): the queue is the scores above 0
--   T:tickets  ZSET  ticket (queued, whose waiter called again or waits less than a lease
--                    time) -> when it is dropped unless its waiter calls again (us). A
--                    ticket not in it is dropped a lease time after its place: a waiter's
--                    first call writes T:queue alone, and a grant reads T:tickets only when
--                    `stamped` says it holds any.
-- (Older versions kept the grants in a fifth key, T:granted: a limiter's keys are not shared
-- with them, see docs/concurrency.md.)
--   T:wake:<process>  CHANNEL  wake-ups for that process's waiters (tickets ending in ':p'),
--                    published to its subscriber; LIST  those nobody heard, read by the
--                    subscriber once subscribed, and the wake-ups of tickets ending in ':h'
--                    (a cluster client's, an older client's), for its waker's BLPOP
-- Times are the server's TIME: no client clock is read. A fence is max(last + 1, now in us):
-- it only grows while the server's clock does not go back past its own earlier readings, even
-- when every key is lost (FLUSHALL, a restart without persistence), as the next fence given is
-- at least the time it is given at.
--
-- FIFO: whenever slots are free, the tickets at the head of the queue are granted in order
-- (`promote`), as many as fit; a head that does not fit stops it, so a 2-permit waiter is not
-- passed by 1-permit arrivals, and a newcomer is granted at once only when nobody waits.
-- The script that frees the slot hands the lease over (`wake`): to a waiter of the calling
-- process in its own reply, to another process on that process's wake channel (a ticket
-- ending in ':p') or list (':h'), the lease id in the wake-up ("<ticket> <lease id> <lease
-- us>"), the ticket alone on the list for an older client's (which asks for its lease: a take
-- collects it, and renews it). The grant stays in T:queue until its lease is dropped or
-- collected, so a waiter whose wake-up was lost still finds it when it asks. One that never
-- comes (killed) holds it until its lease ends, like any holder.
-- An attempt is LEASE.take, a release LEASE.release: one a call (lease_take, lease_release),
-- or several made together in one call (lease_many), which reads and writes the state once.
-- Every loop is bounded: RECLAIM holders or tickets reclaimed per call, SCAN tickets
-- promoted or read ahead of a caller. A call reads no more of a ZSET than it acts on: the
-- earliest holder, the head tickets that may fit, the permits queued from `queued`; and
-- neither T:holders nor T:tickets for what has ended before its bound (hdue, tdue) is due.
-- A bound is kept lowered by every grant (hdue) and every ticket stamped (tdue); a bound
-- written before a grant or a ticket of another version's scripts (which keep none) no longer
-- matches fence or seq, and is read again.
-- Numbers read are made numbers with `+ 0` (one conversion; tonumber makes two).

local LEASE = { RECLAIM = 100, SCAN = 100, WAKE_TTL_MS = 60000, NONE = MAX_EXACT }

function LEASE.load(sem_key)
  local f = redis.call('HMGET', sem_key, 'max', 'lease', 'fence', 'seq', 'used', 'queued',
    'expires_at', 'hdue', 'hfence', 'tdue', 'tseq', 'stamped')
  if not f[1] then
    return nil
  end
  local seq, used, queued = (f[4] or 0) + 0, (f[5] or 0) + 0, (f[6] or 0) + 0
  local fence = (f[3] or 0) + 0
  local stamped = f[12] and f[12] + 0 or false
  local hdue = f[8] and f[9] and f[9] + 0 == fence and f[8] + 0 or false
  local tdue = f[10] and f[11] and f[11] + 0 == seq and f[10] + 0 or false
  return { -- (every field in the constructor: the table is made its size once)
    key = sem_key,
    max = f[1] + 0,
    lease = f[2] + 0,
    fence = fence,
    fence_text = false, -- (the fence given by this call, as text)
    hdue = hdue, -- (false: not known)
    tdue = tdue,
    hdue0 = hdue,
    tdue0 = tdue,
    seq = seq,
    used = used,
    queued = queued,
    seq0 = seq, -- (as loaded: save writes what changed)
    used0 = used,
    queued0 = queued,
    stamped = stamped, -- (false: not known, T:tickets counted when asked)
    stamped0 = stamped,
    expires_at = f[7] and f[7] + 0 or false,
    earliest = false, -- (when the earliest holder's lease ends, -1: none, false: not read)
    tidied = false, -- (what had ended by now reclaimed: once per call)
  }
end

function LEASE.permits(member)
  return match(member, '^(%d+):') + 0
end

-- `permits` more (or fewer) permits queued; never below 0.
function LEASE.count_queued(state, permits)
  state.queued = math.max(0, state.queued + permits)
end

-- How many tickets T:tickets holds (counted once when T:sem does not say).
function LEASE.stamps(state, keys)
  if not state.stamped then
    state.stamped = redis.call('ZCARD', keys[4])
  end
  return state.stamped
end

-- `tickets` (a list, from `first` to `last`) out of T:tickets, if it holds any.
function LEASE.unstamp(state, keys, tickets, first, last)
  if LEASE.stamps(state, keys) > 0 then
    state.stamped = math.max(0, state.stamped - redis.call('ZREM', keys[4], unpack(tickets, first, last)))
  end
end

-- A ticket is dropped no sooner than `due` (us): the bound lowered (tdue).
function LEASE.lower_tdue(state, due)
  if state.tdue and due < state.tdue then
    state.tdue = due
  end
end

-- A key written by this call lives no longer than the limiter (expire()).
function LEASE.bound(state, key)
  if state.expires_at then
    redis.call('PEXPIREAT', key, format('%d', state.expires_at))
  end
end

-- When the earliest holder's lease ends (us); nil with no holder. Read once, and again only
-- after a holder was dropped or renewed; hdue is then that time.
function LEASE.earliest(state, keys)
  if not state.earliest then
    local first = redis.call('ZRANGE', keys[2], 0, 0, 'WITHSCORES')
    state.earliest = first[2] and first[2] + 0 or -1
    state.hdue = first[2] and state.earliest or LEASE.NONE
  end
  return state.earliest >= 0 and state.earliest or nil
end

-- A holder's lease now ends at `ends` (us): granted, or renewed (a lease time lowered since
-- may end it sooner than it would have).
function LEASE.lower_due(state, ends)
  if state.hdue and ends < state.hdue then
    state.hdue = ends
  end
end

-- No holder's lease ends before this (us); nil with no holder. A bound, not read when known.
function LEASE.due(state, keys)
  if state.used <= 0 then
    return nil
  end
  local due = state.hdue
  if not due or due >= LEASE.NONE then
    return LEASE.earliest(state, keys)
  end
  return due
end

-- Drops holders whose lease has ended (at most RECLAIM), if the earliest has.
function LEASE.reclaim_holders(state, keys, now)
  if state.hdue and state.hdue > now then
    return -- (the common case: nothing read)
  end
  local earliest = LEASE.earliest(state, keys)
  if not earliest or earliest > now then
    return
  end
  local expired = redis.call('ZRANGEBYSCORE', keys[2], '-inf', format('%d', now),
    'LIMIT', 0, LEASE.RECLAIM)
  for _, id in ipairs(expired) do
    LEASE.drop_holder(state, keys, id)
  end
  LEASE.reclaim_granted(state, keys, now)
  state.hdue = false -- (read again when asked)
end

-- Removes a holder and its slots, and its grant in T:queue if it was granted in the queue
-- (a fence names one lease); whether it was there. `used` never goes below 0: only a holder
-- that was there gives its permits back.
function LEASE.drop_holder(state, keys, id)
  if redis.call('ZREM', keys[2], id) == 0 then
    return false
  end
  local permits, fence = match(id, '^(%d+):(%d+)$')
  fence = '-' .. fence
  redis.call('ZREMRANGEBYSCORE', keys[3], fence, fence)
  state.used = math.max(0, state.used - permits)
  state.earliest = false
  return true
end

-- Drops tickets whose waiter stopped calling (at most RECLAIM of each kind), once one may
-- have; how many. A stamped ticket (T:tickets) ends at its stamp, any other a lease time
-- after its place.
function LEASE.reclaim_tickets(state, keys, now)
  if state.tdue and state.tdue > now then
    return 0 -- (the common case: nothing read)
  end
  local stamped = LEASE.drop_stamped(state, keys, now)
  local unstamped, read = LEASE.drop_unstamped(state, keys, now)
  state.tdue = false
  if stamped < LEASE.RECLAIM and read < LEASE.RECLAIM then -- (every ticket due is gone)
    local due = LEASE.NONE
    if state.stamped > 0 then
      local first = redis.call('ZRANGE', keys[4], 0, 0, 'WITHSCORES')
      due = first[2] and first[2] + 0 or due
    end
    local place = redis.call('ZRANGEBYSCORE', keys[3], format('(%d', now - state.lease), '+inf',
      'WITHSCORES', 'LIMIT', 0, 1)
    state.tdue = place[2] and math.min(due, place[2] + state.lease) or due
  end
  return stamped + unstamped
end

-- Drops the stamped tickets whose stamp has passed; how many.
function LEASE.drop_stamped(state, keys, now)
  if LEASE.stamps(state, keys) == 0 then
    return 0
  end
  local expired = redis.call('ZRANGEBYSCORE', keys[4], '-inf', format('%d', now),
    'LIMIT', 0, LEASE.RECLAIM)
  if #expired > 0 then
    LEASE.unstamp(state, keys, expired, 1, #expired)
    LEASE.drop_queued(state, keys, expired)
  end
  return #expired
end

-- Drops the tickets placed a lease time ago or more that no stamp keeps: how many, and how
-- many were read.
function LEASE.drop_unstamped(state, keys, now)
  local old = redis.call('ZRANGEBYSCORE', keys[3], '(0', format('%d', now - state.lease),
    'LIMIT', 0, LEASE.RECLAIM)
  local gone = old
  if #old > 0 and LEASE.stamps(state, keys) > 0 then
    gone = {}
    for _, ticket in ipairs(old) do
      local stamp = redis.call('ZSCORE', keys[4], ticket)
      if not stamp or stamp + 0 <= now then
        gone[#gone + 1] = ticket
      end
    end
    if #gone > 0 then
      LEASE.unstamp(state, keys, gone, 1, #gone)
    end
  end
  if #gone > 0 then
    LEASE.drop_queued(state, keys, gone)
  end
  return #gone, #old
end

-- Tickets out of the queue, their permits no longer queued.
function LEASE.drop_queued(state, keys, tickets)
  redis.call('ZREM', keys[3], unpack(tickets))
  for _, ticket in ipairs(tickets) do
    LEASE.count_queued(state, -LEASE.permits(ticket))
  end
end

-- Drops grants whose lease ended long ago without being dropped here (an older client's
-- script dropped the holder): at most RECLAIM.
function LEASE.reclaim_granted(state, keys, now)
  local stale = redis.call('ZRANGEBYSCORE', keys[3], format('(%d', state.lease - now), '(0',
    'LIMIT', 0, LEASE.RECLAIM)
  if #stale > 0 then
    redis.call('ZREM', keys[3], unpack(stale))
  end
end

-- The permits of the tickets ahead of place `seq` (all tickets: seq nil), or nil when more
-- than SCAN are ahead (the caller's turn is not near).
function LEASE.ahead(queue_key, seq)
  local ahead = redis.call('ZRANGEBYSCORE', queue_key, '(0', seq and '(' .. seq or '+inf',
    'LIMIT', 0, LEASE.SCAN + 1)
  if #ahead > LEASE.SCAN then
    return nil
  end
  local permits = 0
  for _, ticket in ipairs(ahead) do
    permits = permits + LEASE.permits(ticket)
  end
  return permits
end

-- The tickets at the head of the queue that may fit in `free` slots (each takes one at least).
function LEASE.head(queue_key, free)
  return redis.call('ZRANGEBYSCORE', queue_key, '(0', '+inf', 'LIMIT', 0, math.min(free, LEASE.SCAN))
end

-- Grants the tickets at the head of the queue, in order, while they fit in the free slots,
-- and hands each its lease (`wake`): those of `process` (nil: none) are added to `handed`.
-- With `reclaim`, tickets whose waiter stopped calling are dropped first (a release grants
-- the head as it finds it: the attempts of the waiters that queue keep the queue clean).
-- Returns whether the queue is empty now (false when no slot was free: not read), and how
-- many tickets were granted.
function LEASE.promote(state, keys, now, process, handed, reclaim)
  local free = state.max - state.used
  if free <= 0 then
    return false, 0
  end
  local head = LEASE.head(keys[3], free)
  if #head == 0 then
    state.queued = 0 -- (what was lost is counted no longer)
    return true, 0
  end
  if reclaim and LEASE.reclaim_tickets(state, keys, now) > 0 then
    head = LEASE.head(keys[3], free)
  end
  local read_all = #head < math.min(free, LEASE.SCAN)
  local lease_ends = format('%d', now + state.lease)
  local granted, places = 0, { 'XX' }
  for _, ticket in ipairs(head) do
    local permits = LEASE.permits(ticket)
    if permits > free then
      break
    end
    free, granted = free - permits, granted + 1
    LEASE.count_queued(state, -permits)
    local fence = LEASE.grant(state, keys, permits, lease_ends, now)
    places[2 * granted], places[2 * granted + 1] = '-' .. fence, ticket
    LEASE.wake(state, ticket, permits .. ':' .. fence, process, handed)
  end
  if granted > 0 then -- (each granted ticket kept, by minus its fence, until it is collected)
    redis.call('ZADD', keys[3], unpack(places))
    LEASE.unstamp(state, keys, head, 1, granted)
  end
  return read_all and granted == #head, granted
end

-- Tells the waiter of `ticket` that it holds lease `id`: in the caller's reply (`handed`)
-- when its process is `process`, else on its process's wake channel (a ticket ending in
-- ':p': one PUBLISH, nothing kept), else on its process's wake list; there too when the
-- channel reached no one (the process's subscriber is subscribing or reconnecting: it reads
-- the list once subscribed).
function LEASE.wake(state, ticket, id, process, handed)
  local owner = match(ticket, '^%d+:([^:]+):')
  if owner == process then
    handed[#handed + 1] = ticket
    handed[#handed + 1] = id
    return
  end
  local wake = string.sub(state.key, 1, -4) .. 'wake:' .. owner -- (T:sem without 'sem')
  local kind = string.sub(ticket, -2)
  local message = ticket
  if kind == ':p' or kind == ':h' then
    message = ticket .. ' ' .. id .. ' ' .. fmt(state.lease)
  end
  if kind == ':p' then
    local heard = redis.pcall('PUBLISH', wake, message) -- (an error reply is a table)
    if type(heard) == 'number' and heard > 0 then
      return
    end
  end
  redis.call('LPUSH', wake, message)
  redis.call('PEXPIRE', wake, LEASE.WAKE_TTL_MS)
end

-- A new holder of `permits`, its lease ending at `lease_ends` (text); its fence, as text.
function LEASE.grant(state, keys, permits, lease_ends, now)
  state.fence = math.max(state.fence + 1, now)
  state.used = state.used + permits
  LEASE.lower_due(state, now + state.lease)
  if state.earliest == -1 then -- (the first holder: a later grant ends no earlier)
    state.earliest = now + state.lease
  end
  local fence = format('%d', state.fence)
  state.fence_text = fence
  redis.call('ZADD', keys[2], lease_ends, permits .. ':' .. fence)
  LEASE.bound(state, keys[2])
  return fence
end

-- Reclaims ended holders and tickets (once per call: what a call does itself never ends
-- before it) and grants the head of the queue if a slot is free; whether the queue is empty
-- (as promote).
function LEASE.tidy(state, keys, now)
  local reclaim = not state.tidied
  if reclaim then
    state.tidied = true
    LEASE.reclaim_holders(state, keys, now)
  end
  if state.used >= state.max then -- (no slot free: the queue is not read, only kept clean)
    if reclaim then
      LEASE.reclaim_tickets(state, keys, now)
    end
    return false
  end
  return (LEASE.promote(state, keys, now, nil, nil, reclaim))
end

-- One attempt of `ticket` for `permits` (lease_take.lua); its reply.
function LEASE.take(state, keys, now, permits, ticket, wait)
  if not state then
    return { -1 }
  elseif permits > state.max then
    return { -2, state.max }
  end
  local empty = LEASE.tidy(state, keys, now)
  local free = state.max - state.used
  local fits = empty and permits <= free -- (nobody waits: the ticket is not queued either)
  local queues = wait ~= 0 and not fits
  local ahead = queues and LEASE.enqueue(state, keys, now, permits, ticket) -- (a new place)
  local place = not ahead and redis.call('ZSCORE', keys[3], ticket)
  if place and place + 0 < 0 then -- (granted in the queue: collected, and renewed)
    local reply = LEASE.collect(state, keys, now, permits, ticket, -place)
    if reply then
      return reply
    end -- (its lease ended before its waiter came for it: the ticket queues again, at the end)
    place = false
    ahead = queues and LEASE.enqueue(state, keys, now, permits, ticket)
  end
  if fits then
    local id = permits .. ':' .. LEASE.grant(state, keys, permits, format('%d', now + state.lease), now)
    return { 0, id, state.lease }
  end
  if wait == 0 then
    LEASE.leave(state, keys, now, permits, ticket, place)
  else
    LEASE.stamp(state, keys, now, ticket, wait, ahead)
    ahead = ahead or LEASE.ahead(keys[3], place) or -1
  end
  local due = LEASE.due(state, keys)
  return { 1, due and math.max(0, due - now) or -1, free, ahead or -1, state.lease }
end

-- The lease of fence `fence` granted to `ticket` in the queue, renewed for its waiter; nil
-- when it has ended. The ticket leaves the queue either way.
function LEASE.collect(state, keys, now, permits, ticket, fence)
  redis.call('ZREM', keys[3], ticket)
  local id = permits .. ':' .. format('%d', fence)
  local lease_ends = format('%d', now + state.lease)
  if redis.call('ZADD', keys[2], 'XX', 'CH', lease_ends, id) == 1 or redis.call('ZSCORE', keys[2], id) then
    state.earliest = false
    LEASE.lower_due(state, now + state.lease)
    return { 0, id, state.lease }
  end
  return nil
end

-- A ticket that gives up leaves the queue (it may have been a head that did not fit); its
-- place, nil or false when it had none.
function LEASE.leave(state, keys, now, permits, ticket, place)
  if place then
    redis.call('ZREM', keys[3], ticket)
    LEASE.unstamp(state, keys, { ticket }, 1, 1)
    LEASE.count_queued(state, -permits)
    LEASE.promote(state, keys, now, nil, nil, false)
  end
end

-- A waiter's ticket queued at the end, unless it has a place (or a grant) already: the
-- permits ahead of it (every ticket queued), or false. Its place is when it was queued (after
-- every earlier one): unless its waiter calls again, it is dropped a lease time after.
function LEASE.enqueue(state, keys, now, permits, ticket)
  local seq = math.max(state.seq + 1, now)
  if redis.call('ZADD', keys[3], 'NX', format('%d', seq), ticket) == 0 then
    return false
  end
  local ahead = state.queued
  state.seq = seq
  LEASE.count_queued(state, permits)
  LEASE.bound(state, keys[3])
  LEASE.lower_tdue(state, seq + state.lease)
  return ahead
end

-- A waiter's ticket stamped: dropped unless its waiter calls again within its wait or a
-- lease time, whichever is shorter. A ticket queued by this call (`new`) waiting a lease
-- time or more is not: its place says when it was queued.
function LEASE.stamp(state, keys, now, ticket, wait, new)
  local keep = state.lease
  if wait > 0 and wait < keep then
    keep = wait
  elseif new then
    return
  end
  local added = redis.call('ZADD', keys[4], format('%d', now + keep), ticket)
  state.stamped = LEASE.stamps(state, keys) + added
  LEASE.bound(state, keys[4])
  LEASE.lower_tdue(state, now + keep)
end

-- The holder of lease `id` hands it back (lease_release.lua); the waiters that now fit are
-- granted, those of `process` handed their leases in the reply: {held (1 when it was held
-- until now), lease us, ticket, lease id, ...}, or {0} when it had gone already.
function LEASE.release(state, keys, now, id, process)
  if not state then
    return { 0 }
  end
  local held = 1
  if state.hdue and state.hdue > now then -- (no lease has ended: one held is held until now)
    if not LEASE.drop_holder(state, keys, id) then
      return { 0 }
    end
  else
    local expires = redis.call('ZSCORE', keys[2], id)
    if not expires then
      return { 0 }
    end
    LEASE.drop_holder(state, keys, id)
    held = expires + 0 > now and 1 or 0
  end
  local reply = { held, state.lease }
  LEASE.promote(state, keys, now, process, reply, false)
  return reply
end

-- Writes the counters this call changed.
function LEASE.save(state)
  local fields = {}
  if state.used ~= state.used0 then
    fields[#fields + 1], fields[#fields + 2] = 'used', fmt(state.used)
  end
  if state.queued ~= state.queued0 then
    fields[#fields + 1], fields[#fields + 2] = 'queued', fmt(state.queued)
  end
  if state.stamped and state.stamped ~= state.stamped0 then
    fields[#fields + 1], fields[#fields + 2] = 'stamped', fmt(state.stamped)
  end
  if state.fence_text then
    fields[#fields + 1], fields[#fields + 2] = 'fence', state.fence_text
  end
  if state.seq ~= state.seq0 then
    fields[#fields + 1], fields[#fields + 2] = 'seq', format('%d', state.seq)
  end
  if state.hdue and (state.hdue ~= state.hdue0 or state.fence_text) then
    fields[#fields + 1], fields[#fields + 2] = 'hdue', format('%d', state.hdue)
    fields[#fields + 1], fields[#fields + 2] = 'hfence', state.fence_text or format('%d', state.fence)
  end
  if state.tdue and (state.tdue ~= state.tdue0 or state.seq ~= state.seq0) then
    fields[#fields + 1], fields[#fields + 2] = 'tdue', format('%d', state.tdue)
    fields[#fields + 1], fields[#fields + 2] = 'tseq', format('%d', state.seq)
  end
  if #fields > 0 then
    redis.call('HSET', state.key, unpack(fields))
  end
end
