-- What a sliding window's log keeps of the grants it has reclaimed, so that set_rate with
-- keep_state to a longer interval counts them again (the Python twin is
-- backends/memory/_held.py). A budget's value key ends with up to HELD_BUCKETS entries
-- " ~<permits>:<at>", oldest first: the permits of reclaimed grants that started in one
-- interval-aligned span of the log's interval, `at` the latest start among them. Brought
-- back, an entry is logged at `at`, so it counts no shorter than its grants would: never
-- more admitted than with the grants themselves. What is older than the last HELD_BUCKETS
-- spans, or in a budget whose keys have expired, is forgotten.

local HELD_BUCKETS = 2

-- Until when a budget's state is kept: what it counts until `counts` (us), its summary for
-- set_rate to a longer interval until `horizon`, but a config with a keep_alive lives only
-- that long after its last call once the grants have stopped counting: so no longer.
local function kept_until(config, counts, horizon, now)
  if config.keep_alive > 0 then
    return min(horizon, max(counts, now + config.keep_alive))
  end
  return horizon
end

-- A budget's held entries are one flat array, oldest first: { permits 1, at 1, permits 2, at 2 }
-- (no table per entry: this is read and written on most calls of a busy log).

-- The value without its held entries, and the entries.
local function parse_held(raw)
  local at = string.find(raw, ' ~', 1, true)
  if not at then
    return raw, {} -- (nothing held)
  end
  local value = string.sub(raw, 1, at - 1)
  -- What this file writes: one or two entries, each read with one match.
  local p1, a1, p2, a2 = match(raw, '^ ~(%d+):(%-?%d+) ~(%d+):(%-?%d+)$', at)
  if p1 then
    return value, { p1 + 0, a1 + 0, p2 + 0, a2 + 0 }
  end
  p1, a1 = match(raw, '^ ~(%d+):(%-?%d+)$', at)
  if p1 then
    return value, { p1 + 0, a1 + 0 }
  end
  local held = {}
  for permits, start in string.gmatch(string.sub(raw, at), ' ~(%d+):(%-?%d+)') do
    if #held < 2 * HELD_BUCKETS then
      held[#held + 1], held[#held + 2] = tonumber(permits), tonumber(start)
    end
  end
  return value, held
end

local function format_held(held)
  local n = held and #held or 0
  if n == 0 then
    return ''
  elseif n == 2 then -- (joined from fmt's texts: see lib.lua)
    return ' ~' .. fmt(held[1]) .. ':' .. fmt(held[2])
  elseif n == 4 then
    return ' ~' .. fmt(held[1]) .. ':' .. fmt(held[2]) .. ' ~' .. fmt(held[3]) .. ':' .. fmt(held[4])
  end
  local parts = {}
  for i = 1, n, 2 do
    parts[#parts + 1] = format(' ~%d:%d', held[i], held[i + 1])
  end
  return table.concat(parts)
end

-- The later of `last` and the newest held entry's `at` (nil: neither).
local function with_held(budget, last)
  local at = budget.held[#budget.held]
  if at and not (last and last >= at) then
    return at
  end
  return last
end

-- Keeps `permits` of grants reclaimed from the log, the latest of which started at `at`.
local function hold(budget, permits, at, interval)
  if permits <= 0 then
    return
  end
  local held = budget.held
  local n = #held
  if n > 0 and floor(held[n] / interval) == floor(at / interval) then
    held[n - 1], held[n] = held[n - 1] + permits, max(held[n], at)
    return
  end
  held[n + 1], held[n + 2] = permits, at
  if n + 2 > 2 * HELD_BUCKETS then
    table.remove(held, 1)
    table.remove(held, 1)
  end
end

-- Logs again the held entries the budget's (new) interval still counts at `now`, each as one
-- grant at its `at`; returns the permits logged. The walk cursor starts over.
local function restore_held(budget, now)
  local held, kept, back = budget.held, nil, 0
  for i = 2, #held, 2 do
    if held[i] > now - budget.interval then
      kept = {}
      break
    end
  end
  if not kept then
    return 0 -- (the common case: nothing held that the interval counts, nothing to allocate)
  end
  for i = 1, #held, 2 do
    local permits, at = held[i], held[i + 1]
    if at > now - budget.interval then
      budget.seq = budget.seq + 1
      redis.call('ZADD', budget.permits_key, fmt(at), fmt(permits) .. ':' .. fmt(budget.seq))
      back = back + permits
    else
      kept[#kept + 1], kept[#kept + 2] = permits, at
    end
  end
  if back > 0 then
    budget.held, budget.used, budget.cs = kept, budget.used + back, nil
    budget.dirty, budget.fresh = true, nil
  end
  return back
end
