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
    return math.min(horizon, math.max(counts, now + config.keep_alive))
  end
  return horizon
end

-- The value without its held entries, and the entries ({permits, at}, oldest first).
local function parse_held(raw)
  local held = {}
  local at = string.find(raw, ' ~', 1, true)
  if not at then
    return raw, held -- (nothing held)
  end
  for permits, start in string.gmatch(string.sub(raw, at), ' ~(%d+):(%-?%d+)') do
    if #held < HELD_BUCKETS then
      held[#held + 1] = { tonumber(permits), tonumber(start) }
    end
  end
  return string.sub(raw, 1, at - 1), held
end

local function format_held(held)
  if not held or #held == 0 then
    return ''
  end
  local parts = {}
  for i, entry in ipairs(held) do
    parts[i] = string.format(' ~%d:%d', entry[1], entry[2])
  end
  return table.concat(parts)
end

-- The later of `last` and the newest held entry's `at` (nil: neither).
local function with_held(budget, last)
  local held = budget.held[#budget.held]
  if held and not (last and last >= held[2]) then
    return held[2]
  end
  return last
end

-- Keeps `permits` of grants reclaimed from the log, the latest of which started at `at`.
local function hold(budget, permits, at, interval)
  if permits <= 0 then
    return
  end
  local held = budget.held
  local last = held[#held]
  if last and math.floor(last[2] / interval) == math.floor(at / interval) then
    last[1], last[2] = last[1] + permits, math.max(last[2], at)
    return
  end
  held[#held + 1] = { permits, at }
  if #held > HELD_BUCKETS then
    table.remove(held, 1)
  end
end

-- Logs again the held entries the budget's (new) interval still counts at `now`, each as one
-- grant at its `at`; returns the permits logged. The walk cursor starts over.
local function restore_held(budget, now)
  local kept, back = {}, 0
  for _, entry in ipairs(budget.held) do
    if entry[2] > now - budget.interval then
      budget.seq = budget.seq + 1
      redis.call('ZADD', budget.permits_key, fmt(entry[2]), fmt(entry[1]) .. ':' .. fmt(budget.seq))
      back = back + entry[1]
    else
      kept[#kept + 1] = entry
    end
  end
  if back > 0 then
    budget.held, budget.used, budget.cs = kept, budget.used + back, nil
    budget.dirty, budget.fresh = true, nil
  end
  return back
end
