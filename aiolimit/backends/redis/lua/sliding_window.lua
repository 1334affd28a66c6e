-- The sliding window: a log of grants per rate, each scored by its start; a grant counts until
-- one interval after it starts (backends/memory/_sliding.py is its Python twin).
-- The log of one rate (its keys, reading, writing and reclaiming it): sliding_log.lua.

-- -- the group (see groups.lua): group.budgets holds a log per rate ----------------------
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
    budget.rate, budget.interval, budget.base = r.rate, r.interval, r.interval
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
    -- (longer while a provider holds the log's grants longer: sliding_floors.lua)
    budget.interval = budget.base + min(lag_at(budget, now), budget.base)
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
  return false
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
      budget.handed = max(budget.handed or start, start) -- (sliding_log.lua)
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

-- The entry of a provider's last count, out of the log if it is still logged there.
local function drop_excess(budget)
  local excess = budget.excess
  if not excess then
    return
  end
  budget.excess, budget.dirty = nil, true
  local logged = fmt(excess[1]) .. ':' .. fmt(excess[2])
  local score = redis.call('ZSCORE', budget.permits_key, logged)
  if score and tonumber(score) == excess[3] then
    redis.call('ZREM', budget.permits_key, logged)
    cursor_moved(budget, excess[3], -excess[1])
    budget.used = budget.used - excess[1]
  end
end

-- Each rate allows at most `remaining` more permits until now + reset_us (at most one
-- interval on), as the log holds now: a lag that holds its grants as long as the provider
-- does, and an entry of what it counts beyond the log's grants that have started, scored to
-- leave the window at the reset, in place of the last count's (sliding_floors.lua). The
-- grants logged stay as they are, each found by its member, so that a settle for less hands
-- back what the provider hands back on completion.
function sliding.sync(group, remaining, reset_us, now)
  if reset_us <= 0 then
    return
  end
  local budgets, seq = group.budgets, 0
  for k = 1, #budgets do
    seq = max(seq, budgets[k].seq)
  end
  seq = seq + 1
  for k = 1, #budgets do
    local budget = budgets[k]
    if not budget.fresh then
      flush_log(budget)
      drop_excess(budget)
    end
    local least = budget.rate - remaining
    if least > 0 then
      local until_ = now + min(reset_us, budget.base)
      local newest, booked = nil, 0
      if not budget.fresh then
        newest, booked = started_and_booked(budget, now)
      end
      local lag = newest and until_ - (newest + budget.base) or 0
      if lag > 0 then -- (grants that left the window already count in `extra`)
        add_lag(budget, lag, until_, now)
        budget.dirty = true
      end
      local extra = least - (budget.used - booked)
      if extra > 0 then
        local at = until_ - budget.base
        redis.call('ZADD', budget.permits_key, fmt(at), fmt(extra) .. ':' .. fmt(seq))
        budget.seq, budget.used, budget.dirty, budget.fresh = seq, budget.used + extra, true, nil
        budget.excess = { extra, seq, at }
        cursor_moved(budget, at, extra)
      end
    end
  end
end
