-- The sliding window's log of one rate: reading and writing a budget, reclaiming the grants
-- that left the window, handing grants back (part of sliding_window.lua, before it in the
-- library, after sliding_walk.lua, whose flush_log it uses; the Python twin is
-- backends/memory/_sliding.py).
-- The log of one rate of a budget:
--   value key    string "<gen> <used> <seq> <cursor>": the config generation the state
--                belongs to, the permits its log holds (granted in the window, reservations
--                included), the sequence number of its last grant, and the walk cursor
--                ("<score> <prefix> <group>", or "-" for none; see `wait_for`), then
--                held.lua's summary of grants that left the window (" ~<permits>:<at>"...),
--                after " ~h<start>" while a grant handed back may still be given its member,
--                after how much longer a provider's count holds the window until when
--                (" ~f<lag>:<until>") and the entry of a provider's last count
--                (" ~x<permits>:<seq>:<start>": sliding_floors.lua).
--   permits key  ZSET: one member "<permits>:<seq>" per grant, scored by its start time.
-- The first rate's are the budget's value key and permits ZSET, rate i's (i > 1)
-- "<tag>:value<i>..." and "<tag>:permits<i>..." (the same names with the rate's number after
-- "value"/"permits"; same hash tag, so the same slot). Both keys carry the same TTL, which
-- outlives the newest grant by HELD_BUCKETS intervals (see save_budget): an idle budget
-- simply disappears.
-- window_start = now - interval, and a grant scored at or before window_start has expired.
--
-- Sequence numbers: an empty log starts over at 1, as a budget whose keys expired does. But a
-- grant handed back (released, settled for fewer) frees its slot, and a later grant of the
-- same start would take its number again (a settle or release of the one would act on the
-- other: counters.lua counts hand-backs for the same reason). So the budget remembers the
-- latest start of a grant handed back (budget.handed, " ~h<start>"), and its keys live as
-- long as they would with that grant logged (see save_budget): until that start has passed,
-- an empty log keeps its numbers.

-- The value without its " ~h<start>" entry, and that start (nil: none).
local function split_handed(raw)
  local at = string.find(raw, ' ~h', 1, true)
  if not at then
    return raw, nil
  end
  local start, rest = match(raw, '^ ~h(%-?%d+)(.*)$', at)
  return string.sub(raw, 1, at - 1) .. rest, tonumber(start)
end

-- Whether the log's sequence may start over at `now` (see above).
local function may_restart(budget, now)
  return not (budget.handed and budget.handed >= now)
end

-- The later of `last` and the latest start handed back (nil: neither).
local function with_handed(budget, last)
  local handed = budget.handed
  if handed and not (last and last >= handed) then
    return handed
  end
  return last
end

-- Reads a budget. State of another generation (or a log without its value key) belongs to
-- no limiter: with `write` it is dropped, without it is simply not counted.
local function load_budget(value_key, permits_key, config, write)
  local budget = { value_key = value_key, permits_key = permits_key, used = 0, seq = 0, held = {} }
  local raw = redis.call('GET', value_key)
  local held
  if raw then
    local handed, lags, excess
    raw, excess = split_excess(raw) -- (sliding_floors.lua)
    raw, lags = split_lags(raw)
    raw, handed = split_handed(raw)
    raw, held = parse_held(raw) -- (held.lua)
    local gen, used, seq, cursor = match(raw, '^(%S+) (%-?%d+) (%d+) (.*)$')
    if not gen then
      error('aiolimit: the state in ' .. value_key .. ' is not aiolimit state; delete() the limiter')
    end
    if gen == config.gen then
      budget.used, budget.seq, budget.held, budget.handed = used + 0, seq + 0, held, handed
      budget.lags, budget.excess = lags, excess
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

local function encode_budget(budget, gen, lags)
  local held = format_held(budget.held)
  if budget.handed then
    held = ' ~h' .. fmt(budget.handed) .. held
  end
  held = lags .. held
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
        if may_restart(budget, window_start + budget.interval) then
          budget.seq = 0
        end
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
    if budget.used == 0 and may_restart(budget, window_start + budget.interval) then
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
  local lags = excess_text(budget, interval, now) .. lags_text(budget, now) -- (sliding_floors.lua)
  if budget.latest and config.keep_alive == 0 then
    kept = redis.call('PTTL', budget.value_key) -- (-2: no key, so the log is this call's)
  end
  if kept ~= -1 then
    local last = with_handed(budget, with_held(budget, budget.latest))
    ttl = max(ms(last + HELD_BUCKETS * interval - now), kept)
  else
    local newest = redis.call('ZRANGE', budget.permits_key, '-1', '-1', 'WITHSCORES')
    local last = with_handed(budget, with_held(budget, newest[2] and tonumber(newest[2])))
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
  redis.call('SET', budget.value_key, encode_budget(budget, config.gen, lags), 'PX', px)
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
    budget.handed = max(budget.handed or score, score) -- (see above)
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
