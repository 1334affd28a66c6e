-- The sliding window: a log of grants per rate, each scored by its start; a grant counts until
-- one interval after it starts (backends/memory/_sliding.py is its Python twin).
-- The log of one rate of a budget:
--   value key    string "<gen> <used> <seq> <cursor>": the config generation the state
--                belongs to, the permits its log holds (granted in the window, reservations
--                included), the sequence number of its last grant, and the walk cursor
--                ("<score> <prefix> <group>", or "-" for none; see `wait_for`), then
--                held.lua's summary of grants that left the window (" ~<permits>:<at>"...).
--   permits key  ZSET: one member "<permits>:<seq>" per grant, scored by its start time.
-- The first rate's are the budget's value key and permits ZSET, rate i's (i > 1)
-- "<tag>:value<i>..." and "<tag>:permits<i>..." (the same names with the rate's number after
-- "value"/"permits"; same hash tag, so the same slot). Both keys carry the same TTL, which
-- outlives the newest grant by HELD_BUCKETS intervals (see save_budget): an idle budget
-- simply disappears.
-- window_start = now - interval, and a grant scored at or before window_start has expired.

-- Reads a budget. State of another generation (or a log without its value key) belongs to
-- no limiter: with `write` it is dropped, without it is simply not counted.
local function load_budget(value_key, permits_key, config, write)
  local budget = { value_key = value_key, permits_key = permits_key, used = 0, seq = 0, held = {} }
  local raw = redis.call('GET', value_key)
  local held
  if raw then
    raw, held = parse_held(raw) -- (held.lua)
    local gen, used, seq, cursor = match(raw, '^(%S+) (%-?%d+) (%d+) (.*)$')
    if not gen then
      error('aiolimit: the state in ' .. value_key .. ' is not aiolimit state; delete() the limiter')
    end
    if gen == config.gen then
      budget.used, budget.seq, budget.held = used + 0, seq + 0, held
      local cs, cp, cg
      if cursor ~= '-' then
        cs, cp, cg = match(cursor, '^(%-?%d+) (%-?%d+) (%-?%d+)$')
      end
      if cs then
        budget.cs, budget.cp, budget.cg = tonumber(cs), tonumber(cp), tonumber(cg)
      end
      return budget
    end
  end
  if write then
    redis.call('UNLINK', permits_key)
    if raw then
      redis.call('DEL', value_key)
    end
  end
  budget.fresh = true
  return budget
end

local function encode_budget(budget, gen)
  local held = format_held(budget.held)
  if budget.cs then
    return format('%s %d %d %d %d %d%s', gen, budget.used, budget.seq, budget.cs, budget.cp, budget.cg, held)
  end
  return gen .. ' ' .. fmt(budget.used) .. ' ' .. fmt(budget.seq) .. ' -' .. held
end

-- Keeps the cursor right when `permits` are added (or, negative, removed) at `score`.
local function cursor_moved(budget, score, permits)
  if budget.cs and score <= budget.cs then
    budget.cp = budget.cp + permits
    if score == budget.cs then
      budget.cg = budget.cg + permits
    end
  end
end

-- Removes grants that have left the window from the log and from `used`: at most
-- RECLAIM_STEPS of them per call (any left over still count, which never over-admits, and
-- go in the next calls). Without `write` nothing is written and `used` is the only change.
local function reclaim(budget, window_start, write)
  if budget.fresh then
    return
  end
  flush_log(budget)
  local key = budget.permits_key
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(window_start), 'WITHSCORES', 'LIMIT', '0', RECLAIM_LIMIT)
  if #expired == 0 then
    return
  end
  if #expired == 2 * RECLAIM_STEPS then
    -- Many expired: if the whole log has, drop it at once (UNLINK frees it off the main thread).
    local newest = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    if tonumber(newest[2]) <= window_start then
      if write then
        hold(budget, budget.used, tonumber(newest[2]), budget.interval)
      end
      budget.used, budget.cs = 0, nil
      if write then
        budget.seq = 0
        budget.dirty = true
        redis.call('UNLINK', key)
      end
      return
    end
  end
  local sum = 0
  for i = 1, #expired, 2 do
    sum = sum + member_permits(expired[i])
  end
  budget.used = budget.used - sum
  if write then
    budget.dirty = true
    redis.call('ZREMRANGEBYRANK', key, '0', fmt(#expired / 2 - 1))
    local last = expired[#expired] + 0
    hold(budget, sum, last, budget.interval)
    if budget.cs and budget.cs <= last then
      budget.cs = nil
    elseif budget.cs then
      budget.cp = budget.cp - sum
    end
    if budget.used == 0 then
      budget.seq = 0 -- an empty log starts over, as a budget whose keys expired does
    end
  end
end

-- Writes a budget back and gives both keys a TTL of HELD_BUCKETS intervals from its newest
-- grant, logged or held (a reservation may lie in the future): one interval for the log,
-- the rest for set_rate to a longer interval (held.lua; not past keep_alive once the log
-- has counted, nor past expire()'s end). Nothing left: gone. Returns the TTL in ms (0: gone).
--
-- A call that granted knows its own latest grant but not the log's newest (an earlier
-- reservation may lie beyond it), and the keys' TTL already covers every grant logged before
-- (every write gives them this TTL, and without keep_alive it only grows with the newest
-- grant): the TTL is the longer of the two, read with PTTL rather than the log's newest entry.
local function save_budget(budget, config, now)
  flush_log(budget)
  local interval = budget.interval or config.interval
  local ttl, kept = nil, -1
  if budget.latest and config.keep_alive == 0 then
    kept = redis.call('PTTL', budget.value_key) -- (-2: no key, so the log is this call's)
  end
  if kept ~= -1 then
    local last = with_held(budget, budget.latest)
    ttl = max(ms(last + HELD_BUCKETS * interval - now), kept)
  else
    local newest = redis.call('ZRANGE', budget.permits_key, '-1', '-1', 'WITHSCORES')
    local last = with_held(budget, newest[2] and tonumber(newest[2]))
    local until_ = last and kept_until(config, last + interval, last + HELD_BUCKETS * interval, now)
    if not (until_ and until_ > now) then
      redis.call('DEL', budget.value_key)
      return 0
    end
    ttl = ms(until_ - now)
  end
  if config.expires_at then
    ttl = max(min(ttl, ms(config.expires_at - now)), 1)
  end
  local px = fmt(ttl)
  redis.call('SET', budget.value_key, encode_budget(budget, config.gen), 'PX', px)
  redis.call('PEXPIRE', budget.permits_key, px)
  return ttl
end

-- (Waiting, the walk of a log to the slot a request waits for: sliding_walk.lua.)

-- Removes the grant `member` from one log, or (member nil) `wanted` permits from its newest
-- grants that have started (at most WALK_STEPS of them); returns how many permits went.
local function release_log(budget, wanted, member, now)
  flush_log(budget)
  local key, count = budget.permits_key, 0
  local function take(m, score, permits)
    redis.call('ZREM', key, m)
    cursor_moved(budget, score, -permits)
    count = count + permits
  end
  if member then
    -- Its entry, if it is still logged at its start: an entry numbered as it is, from another
    -- life of the log, is another grant.
    local permits, start, seq = parse_grant(member)
    local logged = fmt(permits) .. ':' .. fmt(seq)
    local score = redis.call('ZSCORE', key, logged)
    if score and tonumber(score) == start then
      take(logged, start, permits)
    end
    return count
  end
  -- Reservations (grants starting in the future) belong to waiting callers.
  local entries = redis.call('ZREVRANGEBYSCORE', key, fmt(now), '-inf', 'WITHSCORES', 'LIMIT', '0', WALK_LIMIT)
  for i = 1, #entries, 2 do
    if count >= wanted then
      break
    end
    local m, score = entries[i], tonumber(entries[i + 1])
    local permits = member_permits(m)
    local rest = permits - min(permits, wanted - count)
    take(m, score, permits - rest)
    if rest > 0 then
      redis.call('ZADD', key, fmt(score), fmt(rest) .. ':' .. member_id(m))
    end
  end
  return count
end

-- The newest grant's start in any of the group's logs (nil: none logged).
local function newest_start(group)
  local last
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    flush_log(budget)
    if not budget.fresh then
      local newest = redis.call('ZRANGE', budget.permits_key, '-1', '-1', 'WITHSCORES')
      if #newest > 0 then
        last = max(last or tonumber(newest[2]), tonumber(newest[2]))
      end
    end
  end
  return last
end

-- -- the group (see "groups" in lib.lua): group.budgets holds a log per rate ----------------------
-- (Loops over it are numeric: ipairs calls a C function on every step.)
-- (a grant handed back is no longer in its log; the logs live in value keys and permits ZSETs,
-- an OVERALL budget's too)
local sliding = { idempotent = true, in_hash = false }
ALGORITHMS.SLIDING_WINDOW = sliding

function sliding.load(group, write)
  local config = group.config
  group.budgets, group.fresh = {}, true
  for i = 1, #config.rates do
    local r = config.rates[i]
    local value_key, permits_key = group.value_key, group.permits_key
    if i > 1 then
      value_key = rate_key(config, value_key, 'value', i)
      permits_key = rate_key(config, permits_key, 'permits', i)
    end
    local budget = load_budget(value_key, permits_key, config, write)
    budget.rate, budget.interval = r.rate, r.interval
    group.budgets[i] = budget
    group.fresh = group.fresh and budget.fresh
  end
end

function sliding.reclaim(group, now, write)
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    if not write then
      budget.logged = budget.used -- the walk counts the expired grants still logged
    elseif not budget.fresh then
      restore_held(budget, now) -- after set_rate to a longer interval (held.lua)
    end
    reclaim(budget, now - budget.interval, write)
  end
end

function sliding.left(group, now)
  local left, binding
  local budgets = group.budgets
  for i = 1, #budgets do
    local budget = budgets[i]
    local l = budget.rate - budget.used
    if not left or l < left then
      left, binding = l, i
    end
  end
  return left, binding
end

function sliding.start(group, permits, now)
  local start = now
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    if budget.used + permits > MAX_EXACT then
      return nil
    end
    if budget.rate - budget.used < permits and not budget.fresh then
      local need = permits - (budget.rate - (budget.logged or budget.used))
      start = max(start, now + wait_for(budget, need, budget.interval, now))
    end
  end
  return start
end

function sliding.latest(group)
  if #group.budgets > 1 or group.config.spacing > 0 then
    return newest_start(group)
  end
  return nil -- one rate keeps its requests in order by itself
end

function sliding.commit(group, permits, start)
  local seq = 0
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    seq = max(seq, budget.seq)
  end
  seq = seq + 1
  local logged, score = fmt(permits) .. ':' .. fmt(seq), fmt(start)
  for k = 1, #budgets do
    local budget = budgets[k]
    local pending = budget.pending -- (see flush_log)
    if not pending then
      budget.pending = { score, logged }
    else
      local n = #pending
      pending[n + 1], pending[n + 2] = score, logged
      if n + 2 >= PENDING_MOST then
        flush_log(budget)
      end
    end
    budget.seq, budget.fresh = seq, nil
    budget.used = budget.used + permits
    cursor_moved(budget, start, permits)
    budget.latest = max(budget.latest or start, start)
  end
  return seq
end

-- One rate without a spacing (config.lane, batch.lua): the grant at `now` when the log has
-- room for it then (nil: not at `now`), as start, commit and left come to it.
function sliding.grant_now(group, permits, now)
  local budget = group.budgets[1]
  if budget.rate - budget.used < permits or budget.used + permits > MAX_EXACT then
    return nil
  end
  local tag = sliding.commit(group, permits, now)
  return tag, budget.rate - budget.used
end

function sliding.rates_changed()
  -- a log follows the new rates by itself: each grant counts for one interval of the rate
  -- that reads it (a longer one finds what left the window in held.lua's summary)
end

function sliding.keep(group)
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    budget.dirty = budget.dirty or not budget.fresh
  end
end

function sliding.save(group, now)
  local longest = 0
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    if budget.latest or budget.dirty then
      longest = max(longest, save_budget(budget, group.config, now))
    end
  end
  return longest
end

-- The permits logged to start after `now` (the most of any rate's log, at most WALK_STEPS
-- entries read from each) and the latest start; nil when there are none.
function sliding.queued(group, now)
  local permits, latest = 0, nil
  local budgets = group.budgets
  for k = 1, #budgets do
    local entries = redis.call('ZREVRANGEBYSCORE', budgets[k].permits_key, '+inf', '(' .. fmt(now), 'WITHSCORES',
      'LIMIT', '0', WALK_LIMIT)
    local sum = 0
    for i = 1, #entries, 2 do
      sum = sum + member_permits(entries[i])
    end
    if sum > 0 then
      permits, latest = max(permits, sum), max(latest or 0, tonumber(entries[2]))
    end
  end
  if permits == 0 then
    return nil
  end
  return permits, latest
end

function sliding.release(group, wanted, member, now)
  local released = 0
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    local count = release_log(budget, wanted, member, now)
    if count > 0 then
      budget.used = budget.used - count
      budget.dirty = true
    end
    released = max(released, count)
  end
  return released
end

-- -- settle and sync (settle.lua, sync.lua) ------------------------------------------------------

-- The grant `member` counts `wanted` permits fewer: its entry in each log that still counts
-- it is rewritten with fewer permits at the same score (removed for none). Returns the
-- permits handed back and the grant's member from now on.
function sliding.shrink(group, member, wanted, now)
  local permits, start, seq = parse_grant(member)
  local kept, back = permits - wanted, 0
  local logged = fmt(permits) .. ':' .. fmt(seq)
  local budgets = group.budgets
  for k = 1, #budgets do
    local budget = budgets[k]
    flush_log(budget)
    local score = not budget.fresh and start > now - budget.interval and redis.call('ZSCORE', budget.permits_key, logged)
    if score and tonumber(score) == start then
      redis.call('ZREM', budget.permits_key, logged)
      if kept > 0 then
        redis.call('ZADD', budget.permits_key, fmt(start), fmt(kept) .. ':' .. fmt(seq))
      end
      cursor_moved(budget, start, -wanted)
      budget.used, budget.dirty = budget.used - wanted, true
      back = wanted
    end
  end
  if back > 0 then
    return back, fmt(kept) .. ':' .. fmt(start) .. ':' .. fmt(seq)
  end
  return 0, member
end

-- The fewest permits left under any rate, reservations included (settle.lua).
sliding.room = sliding.left

-- The grant `member` counts `extra` permits more, taken at `now`: an entry of its own (the
-- grant keeps its entry, the member its number). Returns the member from now on.
function sliding.charge(group, member, extra, now)
  local permits, start, seq = parse_grant(member)
  sliding.commit(group, extra, now)
  return fmt(permits + extra) .. ':' .. fmt(start) .. ':' .. fmt(seq)
end

-- Each rate allows at most `remaining` more permits until now + reset_us (at most one
-- interval on): an entry of what it allows beyond that, scored to leave the window then.
function sliding.sync(group, remaining, reset_us, now)
  local budgets, seq = group.budgets, 0
  for k = 1, #budgets do
    seq = max(seq, budgets[k].seq)
  end
  seq = seq + 1
  for k = 1, #budgets do
    local budget = budgets[k]
    local over = budget.rate - budget.used - remaining
    if over > 0 and reset_us > 0 then
      local at = now + min(reset_us, budget.interval) - budget.interval
      flush_log(budget)
      redis.call('ZADD', budget.permits_key, fmt(at), fmt(over) .. ':' .. fmt(seq))
      budget.seq, budget.used, budget.dirty, budget.fresh = seq, budget.used + over, true, nil
      cursor_moved(budget, at, over)
    end
  end
end
