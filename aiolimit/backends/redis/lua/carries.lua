-- A provider's floor on fixed windows (sync.lua; the Python twin is
-- backends/memory/_carries.py). sync(remaining, reset) at `since`, whose reset (at most one
-- interval on) ends at `until`, is carried into the window `until` falls in (the carry's
-- window): that window counts `count` more until then, and a window before it at least
-- `count`. A reset past the current window's end is carried into the next window as rate -
-- remaining: the current window keeps counting its own grants and allows no more than
-- `remaining` of them, and every permit it grants from the sync on (a grant, or a charge) is
-- added to `count`, so that the next window starts from what the provider has counted. A
-- reset within the current window is carried into it: what its own count lacks of rate -
-- remaining. From `until` on, a window's own count alone applies.
--
-- A grant that started after `since` in a window before the carry's window takes its permits
-- back from `count` when it is handed back (release, settle): a hand-back frees in both
-- windows what it took there, never more. One from before the sync, in a window that ends
-- before `until`, frees nothing until then (its window counts at least `count`), as a sliding
-- window keeps such grants until the reset.
--
-- Per rate at most CARRIES carries (into the current window, and into the next), group.carries
-- {rate, count, until, since} ordered by rate, until, since and count, kept as the state's
-- last entries " ~c<rate>:<count>:<until>:<since>" (fixed_window.lua). A budget without one
-- takes the counters' own ways (counters.lua). Every loop runs over the rates or the carries.

local CARRIES = 2

-- The number of the window a carry's `until` falls in.
local function carry_window(r, carry)
  return floor((carry[3] - 1) / r.interval)
end

-- What `window` of rate i counts at `at` (in it, not before now), its own grants `own` among them.
local function counted(r, i, carries, window, own, at)
  local into, least = own, 0
  for j = 1, #carries do
    local carry = carries[j]
    if carry[1] == i and at < carry[3] then
      local into_window = carry_window(r, carry)
      if into_window == window then
        into = into + carry[2]
      elseif into_window > window then
        least = max(least, carry[2])
      end
    end
  end
  return max(into, least)
end

-- The window a request at `now` goes into first (the latest when it has not begun:
-- reservations; else the current one), its own permits, and whether it lies ahead.
local function opened(r, a, b, now)
  local window, current = floor((a - 1) / r.interval), floor(now / r.interval)
  if window > current then
    return window, b, true
  end
  return current, window == current and b or 0, false
end

local function carried_left(r, i, carries, a, b, now)
  local window, own, ahead = opened(r, a, b, now)
  if ahead then
    return 0
  end
  return r.rate - counted(r, i, carries, window, own, now)
end

-- `left`, less the permits of the windows ahead (a reservation, a debt), as the rule's `room`.
local function carried_room(r, i, carries, a, b, now)
  local window, own, ahead = opened(r, a, b, now)
  if not ahead then
    return r.rate - counted(r, i, carries, window, own, now)
  end
  local ends = (window - floor(now / r.interval) - 1) * r.rate
  return -(ends + counted(r, i, carries, window, own, window * r.interval))
end

-- The earliest start at which rate i allows `permits`: in the window a request goes into
-- first, or when a carry into it ends; else in the next, or when a carry into it ends.
local function carried_start(r, i, carries, a, b, permits, now)
  local first, own = opened(r, a, b, now)
  for window = first, first + 1 do
    local at = max(now, window * r.interval)
    if counted(r, i, carries, window, own, at) + permits <= r.rate then
      return at
    end
    for j = 1, #carries do
      local carry = carries[j]
      local until_ = carry[3]
      if carry[1] == i and until_ > at and carry_window(r, carry) == window
        and counted(r, i, carries, window, own, until_) + permits <= r.rate then
        return until_
      end
    end
    own = 0
  end
  return (first + 1) * r.interval
end

-- `permits` taken at `start` (a grant, or a charge at now): a window before a carry's window
-- takes them from its carry too, until the carry ends.
local function carry_grant(r, i, carries, permits, start)
  local window = floor(start / r.interval)
  for j = 1, #carries do
    local carry = carries[j]
    if carry[1] == i and start < carry[3] and window < carry_window(r, carry) then
      carry[2] = carry[2] + permits
    end
  end
end

-- `permits` of the grant that started at `start` handed back at `now`: what it took from a
-- carry after its sync goes back to it. The most any carry got back.
local function carry_back(r, i, carries, permits, start, now)
  local window, back = floor(start / r.interval), 0
  for j = 1, #carries do
    local carry = carries[j]
    if carry[1] == i and now < carry[3] and start > carry[4] and window < carry_window(r, carry) then
      local count = min(permits, carry[2])
      carry[2] = carry[2] - count
      back = max(back, count)
    end
  end
  return back
end

local function carry_order(c, d)
  if c[1] ~= d[1] then
    return c[1] < d[1]
  elseif c[3] ~= d[3] then
    return c[3] < d[3]
  elseif c[4] ~= d[4] then
    return c[4] < d[4]
  end
  return c[2] < d[2]
end

-- A sync at `now` whose reset ends at `until_` in `window` (the current one, or the next):
-- the carry into it holds at least `least` until then. One there already is tightened (and
-- counts from this sync); else the rate's carries that have ended go, and (a rate's carries
-- brought together by set_rate) at most CARRIES stay.
local function carry_into(r, i, carries, window, least, until_, now)
  local found, kept, mine = false, {}, {}
  for j = 1, #carries do
    local carry = carries[j]
    if carry[1] ~= i then
      kept[#kept + 1] = carry
    elseif now < carry[3] then
      mine[#mine + 1] = carry
      if carry_window(r, carry) == window then
        carry[2], carry[3], carry[4] = max(carry[2], least), max(carry[3], until_), now
        found = true
      end
    end
  end
  if found then
    table.sort(carries, carry_order)
    return carries
  end
  if #mine >= CARRIES then
    local one = { i, 0, 0, 0 }
    for j = 1, #mine do
      one[2], one[3], one[4] = one[2] + mine[j][2], max(one[3], mine[j][3]), max(one[4], mine[j][4])
    end
    mine = { one }
  end
  for j = 1, #mine do
    kept[#kept + 1] = mine[j]
  end
  kept[#kept + 1] = { i, least, until_, now }
  table.sort(kept, carry_order)
  return kept
end

-- The carries once rate i allows at most rate - `least` more until `until_` (nil: as they
-- are). A reset past the current window's end is carried into the next window, `least` and
-- the grants from now on; one within it into the current window, what its own count lacks
-- (nothing, behind reservations: it allows none more).
local function carry_sync(r, i, carries, a, b, least, until_, now)
  local window, own, ahead = opened(r, a, b, now)
  local next_window = floor(now / r.interval) + 1
  if until_ > next_window * r.interval then
    return carry_into(r, i, carries, next_window, least, until_, now)
  end
  if ahead or least <= own then
    return nil
  end
  return carry_into(r, i, carries, window, least - own, until_, now)
end

-- Reads the carries out of group.tail (its last entries): those of rates the config still
-- has, each for at most one interval after its sync (set_rate with keep_state may have
-- shortened it); at most CARRIES * MAX_RATES (written by this file: never more).
local function take_carries(group)
  local tail = group.tail
  local at = tail and string.find(tail, ' ~c', 1, true)
  if not at then
    return
  end
  local rates, carries, read = group.config.rates, {}, 0
  local entries = string.gmatch(string.sub(tail, at), ' ~c(%d+):(%d+):(%d+):(%d+)')
  for i, count, until_, since in entries do
    read = read + 1
    if read > CARRIES * MAX_RATES then
      break
    end
    local r = rates[tonumber(i)]
    if r then
      since = tonumber(since)
      until_ = min(tonumber(until_), since + r.interval)
      carries[#carries + 1] = { tonumber(i), tonumber(count), until_, since }
    end
  end
  group.tail = at > 1 and string.sub(tail, 1, at - 1) or nil
  group.carries = #carries > 0 and carries or false
end

-- The carries as the state writes them (those that have not ended, when it is written), and
-- until when the last of them counts.
local function carries_text(group, now)
  local carries = group.carries
  if not (carries and group.dirty) then
    return '', nil
  end
  local kept, parts, until_ = {}, {}, 0
  for j = 1, #carries do
    local carry = carries[j]
    if carry[3] > now then
      kept[#kept + 1] = carry
      parts[#parts + 1] = ' ~c' .. fmt(carry[1]) .. ':' .. fmt(carry[2]) .. ':' .. fmt(carry[3])
        .. ':' .. fmt(carry[4])
      until_ = max(until_, carry[3])
    end
  end
  group.carries = #kept > 0 and kept or false
  return table.concat(parts), until_
end

-- Whether a carry still counts at `now`.
local function carrying(group, now)
  local carries = group.carries or {}
  for j = 1, #carries do
    if carries[j][3] > now then
      return true
    end
  end
  return false
end

-- What each rate's window of `at` counts (0: one that has ended).
local function window_counts(group, at, now)
  local rates, n, carries, counts = group.config.rates, group.n, group.carries, {}
  for i = 1, #rates do
    local r = rates[i]
    local window = floor(at / r.interval)
    counts[i] = 0
    if window >= floor(now / r.interval) then
      local own = floor((n[2 * i - 1] - 1) / r.interval) == window and n[2 * i] or 0
      counts[i] = counted(r, i, carries, window, own, max(now, window * r.interval))
    end
  end
  return counts
end

-- What a hand-back of `permits` of the grant that started at `start` (nil: the latest grants,
-- which take nothing back from a carry) freed: in its window (`before`: what each rate's
-- counted), or in a carry's.
local function handed_back(group, before, permits, start, now)
  local rates, carries, freed = group.config.rates, group.carries, 0
  local after = window_counts(group, start or now, now)
  for i = 1, #rates do
    local back = start and carry_back(rates[i], i, carries, permits, start, now) or 0
    if back > 0 then
      group.dirty = true
    end
    freed = max(freed, back, before[i] - after[i])
  end
  return freed
end

-- The group functions of fixed windows (`algorithm`) with carries: where the group keeps
-- one, what left, start and room say, and what a grant, charge or hand-back does, besides
-- the counters' own; and sync. grant_now leaves a group with carries to the whole way.
local function carry_floors(algorithm)
  local left, start, room = algorithm.left, algorithm.start, algorithm.room
  local grant_now, commit, charge = algorithm.grant_now, algorithm.commit, algorithm.charge
  local release, shrink = algorithm.release, algorithm.shrink
  function algorithm.left(group, now)
    local carries, rates, n = group.carries, group.config.rates, group.n
    if not carries then
      return left(group, now)
    end
    local least, binding = carried_left(rates[1], 1, carries, n[1], n[2], now), 1
    for i = 2, #rates do
      local l = carried_left(rates[i], i, carries, n[2 * i - 1], n[2 * i], now)
      if l < least then
        least, binding = l, i
      end
    end
    return least, binding
  end
  function algorithm.start(group, permits, now)
    local carries, rates, n = group.carries, group.config.rates, group.n
    if not carries then
      return start(group, permits, now)
    end
    local at = now
    for i = 1, #rates do
      at = max(at, carried_start(rates[i], i, carries, n[2 * i - 1], n[2 * i], permits, now))
    end
    return at
  end
  function algorithm.room(group, now)
    local carries, rates, n = group.carries, group.config.rates, group.n
    if not carries then
      return room(group, now)
    end
    local least = carried_room(rates[1], 1, carries, n[1], n[2], now)
    for i = 2, #rates do
      least = min(least, carried_room(rates[i], i, carries, n[2 * i - 1], n[2 * i], now))
    end
    return least
  end
  function algorithm.grant_now(group, permits, now)
    if group.carries then
      return nil
    end
    return grant_now(group, permits, now)
  end
  function algorithm.commit(group, permits, at)
    local tag, carries, rates = commit(group, permits, at), group.carries, group.config.rates
    for i = 1, carries and #rates or 0 do
      carry_grant(rates[i], i, carries, permits, at)
    end
    return tag
  end
  function algorithm.charge(group, member, extra, now)
    local settled, carries, rates = charge(group, member, extra, now), group.carries, group.config.rates
    for i = 1, carries and #rates or 0 do
      carry_grant(rates[i], i, carries, extra, now)
    end
    return settled
  end
  function algorithm.release(group, wanted, member, now)
    if not group.carries then
      return release(group, wanted, member, now)
    end
    local permits, at = wanted, nil
    if member then
      permits, at = parse_grant(member)
    end
    local before = window_counts(group, at or now, now)
    release(group, wanted, member, now)
    return handed_back(group, before, permits, at, now)
  end
  function algorithm.shrink(group, member, wanted, now)
    if not group.carries then
      return shrink(group, member, wanted, now)
    end
    local _, at = parse_grant(member)
    local before = window_counts(group, at, now)
    local _, settled = shrink(group, member, wanted, now)
    return handed_back(group, before, wanted, at, now), settled
  end
  function algorithm.sync(group, remaining, reset_us, now)
    local rates, n = group.config.rates, group.n
    for i = 1, #rates do
      local r = rates[i]
      local least, until_ = r.rate - remaining, now + min(reset_us, r.interval)
      if reset_us > 0 and least > 0 then
        local carries = group.carries or {}
        carries = carry_sync(r, i, carries, n[2 * i - 1], n[2 * i], least, until_, now)
        if carries then
          group.carries, group.dirty, group.fresh = carries, true, false
        end
      end
    end
  end
end
