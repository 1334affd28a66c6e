-- A provider's count on a sliding window's log (sync.lua; the Python twin is
-- backends/memory/_sliding_floors.py). sync(remaining, reset) at `now`, whose reset (at most
-- one interval on) ends at `until`, says the provider counts rate - remaining until then.
-- The log takes it two ways:
--   * what the provider counts beyond the log's grants that have started is logged as an
--     entry of its own, scored to leave the window at `until` (`sync` in
--     sliding_window.lua);
--   * a provider that holds the log's grants longer than the log does (its count lasts
--     until `until`, past the time the log's newest started grant leaves the window: it saw
--     them late, or its window is longer) holds them that much longer in the log as well:
--     until `until`, the window is `lag` = until - (newest start + interval) longer (at most
--     one interval), so no grant leaves it before the provider's count does.
-- The grants logged stay as they are, each found by its member: a settle or a release frees
-- what it takes back, as the provider frees what a completed call did not use (and never
-- saw a call that was not sent).
-- A later count replaces an earlier one: the entry of what the last count said the provider
-- counts beyond the log's grants goes before the next is logged (the provider's newest count
-- is its count; an older one had not yet seen calls complete, or calls of other clients leave
-- its window). The log's own grants are never freed by a count.
--
-- A log keeps at most LAGS lags { lag, until } while they count, written in its value key as
-- " ~f<lag>:<until>" entries (sliding_log.lua); the window is longer by the most of them. It
-- keeps the entry of the last count { permits, seq, start } while it may be logged, as
-- " ~x<permits>:<seq>:<start>".

local LAGS = 2

-- The value without its lag entries, and the lags (nil: none).
local function split_lags(raw)
  local at = string.find(raw, ' ~f', 1, true)
  if not at then
    return raw, nil
  end
  local lags, stop = {}, at
  for _ = 1, LAGS do
    local lag, until_, after = match(raw, '^ ~f(%d+):(%-?%d+)()', stop)
    if not lag then
      break
    end
    lags[#lags + 1] = { lag + 0, until_ + 0 }
    stop = after
  end
  return string.sub(raw, 1, at - 1) .. string.sub(raw, stop), lags
end

-- The value without its " ~x" entry, and the entry of the last count (nil: none).
local function split_excess(raw)
  local at = string.find(raw, ' ~x', 1, true)
  if not at then
    return raw, nil
  end
  local permits, seq, start, rest = match(raw, '^ ~x(%d+):(%d+):(%-?%d+)(.*)$', at)
  if not permits then
    error('aiolimit: the state in a value key is not aiolimit state; delete() the limiter')
  end
  return string.sub(raw, 1, at - 1) .. rest, { permits + 0, seq + 0, start + 0 }
end

-- The entry of the last count as the value key writes it: while it may still be logged.
local function excess_text(budget, interval, now)
  local excess = budget.excess
  if not excess or excess[3] + interval <= now then
    budget.excess = nil
    return ''
  end
  return ' ~x' .. fmt(excess[1]) .. ':' .. fmt(excess[2]) .. ':' .. fmt(excess[3])
end

-- How much longer the window is at `now` (0: as the rate says).
local function lag_at(budget, now)
  local longest, lags = 0, budget.lags
  for j = 1, lags and #lags or 0 do
    local l = lags[j]
    if now < l[2] and l[1] > longest then
      longest = l[1]
    end
  end
  return longest
end

-- The lags as the value key writes them: those that still count at `now`.
local function lags_text(budget, now)
  local lags = budget.lags
  if not lags then
    return ''
  end
  local kept, parts = {}, {}
  for j = 1, #lags do
    local l = lags[j]
    if l[2] > now then
      kept[#kept + 1] = l
      parts[#parts + 1] = ' ~f' .. fmt(l[1]) .. ':' .. fmt(l[2])
    end
  end
  budget.lags = #kept > 0 and kept or nil
  return table.concat(parts)
end

-- A lag of `lag` until `until_` at `now`: lags it covers (no longer, ending no later) go; one
-- that covers it stays alone; of more than LAGS, the two that end first become one.
local function add_lag(budget, lag, until_, now)
  local lags, kept = budget.lags or {}, {}
  for j = 1, #lags do
    local l = lags[j]
    if l[2] > now and not (l[1] <= lag and l[2] <= until_) then
      if l[1] >= lag and l[2] >= until_ then
        return
      end
      kept[#kept + 1] = l
    end
  end
  kept[#kept + 1] = { lag, until_ }
  if #kept > LAGS then
    table.sort(kept, function(a, b) return a[2] < b[2] end)
    kept = { { max(kept[1][1], kept[2][1]), kept[2][2] }, kept[3] }
  end
  budget.lags = kept
end

-- The newest start at or before `now` in the log (nil: none), and the permits of the grants
-- that start after `now` (of its WALK_STEPS newest entries).
local function started_and_booked(budget, now)
  local newest = redis.call('ZREVRANGEBYSCORE', budget.permits_key, fmt(now), '-inf', 'WITHSCORES', 'LIMIT', '0', '1')
  local entries = redis.call('ZREVRANGEBYSCORE', budget.permits_key, '+inf', '(' .. fmt(now), 'LIMIT', '0', WALK_LIMIT)
  local booked = 0
  for i = 1, #entries do
    booked = booked + member_permits(entries[i])
  end
  return newest[2] and tonumber(newest[2]), booked
end
