-- Fixed windows, kept as counters (counters.lua); the Python twin is
-- backends/memory/_fixed_window.py. Per rate a = the end of the latest window holding grants
-- (windows are aligned to multiples of the interval since the Unix epoch; its end says which
-- it is under any interval, so a new interval keeps its count), b = the permits in it.
-- Besides, per rate, up to HELD_BUCKETS earlier windows that held grants (group.held:
-- {rate, count, end}, oldest first), kept as the value's tail " ~<rate>:<count>:<ago>", `ago`
-- the rate's latest window end minus theirs: a longer interval (set_rate with keep_state)
-- counts those that fall in its window with the latest one (see `load`). After them, a
-- provider's floors (sync.lua), as carries.lua keeps them.

-- The number of the window that ends at `window_end` (-1: none yet).
local function window_of(r, window_end)
  return floor((window_end - 1) / r.interval)
end

local fixed_rule = {
  loaded = function(r, window_end, count)
    return window_end, count
  end,
  left = function(r, window_end, count, now)
    local window, current = window_of(r, window_end), floor(now / r.interval)
    return window < current and r.rate or (window == current and r.rate - count or 0)
  end,
  start = function(r, window_end, count, permits, now)
    local window = window_of(r, window_end)
    if window < floor(now / r.interval) then
      return now
    end
    if count + permits <= r.rate then
      return window * r.interval
    end
    return (window + 1) * r.interval
  end,
  take = function(r, window_end, count, permits, start)
    local window = floor(start / r.interval)
    if window == window_of(r, window_end) then
      count = count + permits
    else
      count = permits
    end
    return (window + 1) * r.interval, count
  end,
  take_now = function(r, window_end, count, permits, now)
    -- Only in the latest window: a grant that starts another one leaves this one behind,
    -- which `commit` keeps (see below).
    if floor(now / r.interval) == window_of(r, window_end) and count + permits <= r.rate then
      return window_end, count + permits
    end
    return nil
  end,
  tag = function(r, window_end, count, permits)
    return count - permits -- the permits its window held before it
  end,
  span = function(r)
    return r.rate
  end,
  ahead = function(r, window_end, count, now)
    local start = window_of(r, window_end) * r.interval
    if start > now then
      return count, start -- (a window that has not begun holds reservations alone)
    end
    return 0, start
  end,
  until_ = function(r, window_end, count, config, now)
    -- Its window, then the rest of the summary's span, for a longer interval (held.lua).
    local ends = (window_of(r, window_end) + 1) * r.interval
    return kept_until(config, ends, ends + HELD_BUCKETS * r.interval, now)
  end,
  release = function(r, window_end, count, wanted, start, now)
    -- Only the latest window's count is kept: a grant there (or, without a member, in the
    -- current window when nothing is reserved ahead) can go back.
    local window = window_of(r, window_end)
    if floor((start or now) / r.interval) ~= window or window < floor(now / r.interval) then
      return 0, window_end, count -- (another window's, or one that has ended)
    end
    local back = min(wanted, count)
    return back, window_end, count - back
  end,
  -- (settle.lua: see `settling` in counters.lua)
  room = function(r, window_end, count, now)
    -- `left`, less the permits of the windows ahead (reservations, or a debt).
    local window, current = window_of(r, window_end), floor(now / r.interval)
    if window <= current then
      return window < current and r.rate or r.rate - count
    end
    return -((window - current - 1) * r.rate + count)
  end,
  charge = function(r, window_end, count, extra, now)
    -- Added to the latest window, current or ahead (a new current one when it has ended);
    -- past its rate, the rest goes to the windows after it, as reservations would.
    local window = floor(now / r.interval)
    if window_of(r, window_end) >= window then
      window = window_of(r, window_end)
    else
      count = 0
    end
    count = count + extra
    local ahead = max(0, ceil((count - r.rate) / r.rate))
    return (window + ahead + 1) * r.interval, count - ahead * r.rate
  end,
  -- (sync: carries.lua)
}
local fixed = counters(fixed_rule)
fixed.fixed_edges = true -- (windows that would move with a measured margin: margin.lua keeps none)
ALGORITHMS.FIXED_WINDOW = fixed

-- Reads the earlier windows of group.tail (entries of rates the config still has), counting
-- those that lie in a rate's latest window into its count: after set_rate to a longer
-- interval, a window holds the earlier windows it covers (their ends fall inside it).
local function load_windows(group)
  local n, rates, held = group.n, group.config.rates, {}
  group.held = held
  if not group.tail then
    return
  end
  for i, count, ago in string.gmatch(group.tail, ' ~(%d+):(%d+):(%d+)') do
    local r = rates[tonumber(i)]
    if #held == HELD_BUCKETS * MAX_RATES then
      break -- (written by this file: never more)
    end
    i = tonumber(i)
    if r then -- (an entry of a rate the config no longer has is dropped)
      local window_end = n[2 * i - 1] - tonumber(ago)
      if window_of(r, window_end) == window_of(r, n[2 * i - 1]) then
        n[2 * i] = n[2 * i] + tonumber(count)
      else
        held[#held + 1] = { i, tonumber(count), window_end }
      end
    end
  end
  group.tail = nil
end

-- Keeps the window rate i leaves behind at `start`, if it held grants: at most HELD_BUCKETS.
local function hold_window(group, i, start)
  local n, held, r = group.n, group.held, group.config.rates[i]
  if n[2 * i] > 0 and floor(start / r.interval) > window_of(r, n[2 * i - 1]) then
    local first, count = nil, 0
    for j = 1, #held do
      if held[j][1] == i then
        first, count = first or j, count + 1
      end
    end
    if count == HELD_BUCKETS then
      table.remove(held, first)
    end
    held[#held + 1] = { i, n[2 * i], n[2 * i - 1] }
  end
end

-- Keeps the windows a grant at `start` leaves behind.
local function hold_windows(group, start)
  for i = 1, #group.config.rates do
    hold_window(group, i, start)
  end
end

local load, commit, save, grant_now = fixed.load, fixed.commit, fixed.save, fixed.grant_now

-- One entry of the summary: rate i's earlier window of `count` permits, which ended `ago` us
-- before the rate's latest window. (Joined from fmt's texts, which the same few numbers mostly
-- find made: see lib.lua.)
local function held_entry(i, count, ago)
  return ' ~' .. fmt(i) .. ':' .. fmt(count) .. ':' .. fmt(ago)
end

function fixed.load(group, write)
  load(group, write)
  if group.fresh then
    group.tail = nil
  end
  take_carries(group) -- (the tail's last entries)
  local tail, rates = group.tail, group.config.rates
  if tail and #rates == 1 then
    -- One rate, and a tail of one or two entries of it (not of rates the config had before),
    -- whose newest earlier window (the last entry: the least `ago`) lies before its latest
    -- window: none counts into it, and the tail stays as it is (group.held nil) unless a
    -- grant starts another window (commit).
    local ago = match(tail, '^ ~1:%d+:(%d+)$')
      or match(tail, '^ ~1:%d+:%d+ ~1:%d+:(%d+)$')
    local latest = group.n[1]
    ago = tonumber(ago)
    if ago and window_of(rates[1], latest - ago) < window_of(rates[1], latest) then
      group.held = nil
      return
    end
  end
  load_windows(group)
end

function fixed.commit(group, permits, start)
  if not group.held then
    local r = group.config.rates[1]
    if floor(start / r.interval) == window_of(r, group.n[1]) then
      return commit(group, permits, start) -- the same window: the tail's `ago`s still hold
    end
    load_windows(group) -- (counts nothing in: see load)
  end
  hold_windows(group, start)
  return commit(group, permits, start)
end

-- A grant now (config.lane: one rate) that starts a new window, where the earlier windows
-- are as `load` read them without tables: a tail of this rate's alone, none in its latest
-- window (group.held nil), or none (an empty group.held). The window left behind joins them
-- as `commit` and `save` would write it, oldest first, at most HELD_BUCKETS, each `ago` now
-- from the new window's end: in text, without the general way's tables.
function fixed.grant_now(group, permits, now)
  local tag, left = grant_now(group, permits, now)
  local held, r, n = group.held, group.config.rates[1], group.n
  if tag or permits > r.rate or (held and #held > 0) then
    return tag, left
  end
  local window_end, count = n[1], n[2]
  local window = floor(now / r.interval)
  if window <= window_of(r, window_end) then
    return nil -- (a full window, or a reservation ahead: the whole way)
  end
  local ends = (window + 1) * r.interval
  local c1, a1, c2, a2
  if group.tail then
    c1, a1, c2, a2 = match(group.tail, '^ ~1:(%d+):(%d+) ~1:(%d+):(%d+)$')
    if not c1 then
      c2, a2 = match(group.tail, '^ ~1:(%d+):(%d+)$')
    end
  end
  -- The window left behind (if it held grants) after the kept ones; of three, the oldest goes.
  local moved, tail = ends - window_end, ''
  if c1 and count == 0 then
    tail = held_entry(1, c1 + 0, moved + a1)
  end
  if c2 then
    tail = tail .. held_entry(1, c2 + 0, moved + a2)
  end
  if count > 0 then
    tail = tail .. held_entry(1, count, moved)
  end
  n[1], n[2] = ends, permits
  group.tail, group.held = tail ~= '' and tail or nil, nil
  group.last, group.dirty, group.fresh = now, true, false
  return tagged(group, fixed_rule, r, fixed_rule.tag(r, ends, permits, permits, now)),
    fixed_rule.left(r, ends, permits, now)
end

-- Rate i takes new numbers (settle.lua, sync.lua): the window it leaves is kept, as a
-- grant that starts the window its new numbers name would keep it.
function fixed.synced(group, i, window_end)
  if not group.held then
    load_windows(group)
  end
  hold_window(group, i, window_end - 1)
end

function fixed.save(group, now)
  if group.held then
    local parts, n, held = {}, group.n, group.held
    for j = 1, #held do
      local entry = held[j]
      local i = entry[1]
      parts[j] = held_entry(i, entry[2], n[2 * i - 1] - entry[3])
    end
    group.tail = #parts > 0 and table.concat(parts) or nil
  end
  local tail = group.tail
  local carried, until_ = carries_text(group, now) -- (written after the earlier windows)
  if carried ~= '' then
    group.tail = (tail or '') .. carried
  end
  group.tail_until = until_
  local ttl = save(group, now)
  group.tail = tail
  return ttl
end

-- set_rate with keep_state, an OVERALL limiter: its state (in the config, without a TTL)
-- is forgotten when a PER_CLIENT client's key would have expired: HELD_BUCKETS intervals
-- of the rates that wrote it (`olds`) after its latest window's end, for every rate.
local function windows_outlived(group, olds, now)
  local n = group.n
  for i, o in ipairs(olds) do
    if n[2 * i - 1] and (window_of(o, n[2 * i - 1]) + 1 + HELD_BUCKETS) * o.interval > now then
      return false
    end
  end
  return true
end

function fixed.rates_changed(group, olds, old_epochs, now)
  local config = group.config
  if config.in_hash and not group.fresh and windows_outlived(group, olds, now)
    and not carrying(group, now) then
    group.fresh = true -- (the new config has no state field: nothing to remove)
  end
  return false
end

carry_floors(fixed) -- (a provider's floor: carries.lua)
