-- The sliding window's wait: how far a log must be walked until enough permits have left the
-- window (part of sliding_window.lua, before it in the library; the Python twin is
-- backends/memory/_sliding.py).

-- The grants a call logs wait in `budget.pending` ({ score, member, ... }) and go to the ZSET
-- in one ZADD: before anything reads the log, and when the budget is saved (at most
-- PENDING_MOST of them, a bound on the command's size).
local PENDING_MOST = 128

local function flush_log(budget)
  local pending = budget.pending
  if pending then
    budget.pending = nil
    redis.call('ZADD', budget.permits_key, unpack(pending))
  end
end

-- -- waiting ---------------------------------------------------------------------------------
-- A request for `permits` when only `left` are free waits until `need = permits - left` of
-- the logged permits have expired: the log is summed oldest first until it holds `need`,
-- and the wait ends when that grant expires. Summing from the oldest grant every time would
-- cost O(queue depth) per waiter, so the budget keeps a cursor: a score `cs`, the permits
-- `cp` logged at or before it, and the permits `cg` logged exactly at it. Each walk starts
-- at the cursor (forwards when need > cp, else backwards) and leaves it where it stopped, so
-- a queue of waiters served in order moves it a few entries each: O(1) per waiter however
-- deep the queue. A walk reads at most WALK_STEPS entries; if it has not arrived by then it
-- assumes one permit per entry still to come, which reaches `need` no earlier than the exact
-- answer: a later slot, never an earlier one.

local function walk_forward(budget, need)
  local key = budget.permits_key
  local rank, prefix = 0, 0
  if budget.cs then
    rank = redis.call('ZCOUNT', key, '-inf', fmt(budget.cs))
    prefix = budget.cp
  end
  local found, group_score, group = nil, nil, 0
  local steps, size = 0, 16
  while steps < WALK_STEPS do
    local entries = redis.call('ZRANGE', key, rank, rank + size - 1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      local score = tonumber(entries[i + 1])
      if found and score ~= found then
        budget.cs, budget.cp, budget.cg = found, prefix, group
        return found
      end
      local permits = member_permits(entries[i])
      if score == group_score then
        group = group + permits
      else
        group_score, group = score, permits
      end
      prefix = prefix + permits
      rank, steps = rank + 1, steps + 1
      if not found and prefix >= need then
        found = score
      end
    end
    if #entries < 2 * size then -- the end of the log
      if found then
        budget.cs, budget.cp, budget.cg = found, prefix, group
      end
      return found
    end
    size = min(size * 4, WALK_STEPS - steps + 1)
  end
  if found then
    return found
  end
  -- Out of steps: with at least one permit per entry, `need` is reached at most this far on.
  local at = min(rank - 1 + need - prefix, redis.call('ZCARD', key) - 1)
  local entry = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
  return tonumber(entry[2])
end

local function walk_back(budget, need)
  -- The cursor's group holds `need`; find the oldest group that still does.
  local answer = budget.cs
  local below = budget.cp - budget.cg -- permits logged before the answer's group
  if below < need then
    return answer
  end
  local key = budget.permits_key
  local group_score, group, offset, steps, size = nil, 0, 0, 0, 16
  while steps < WALK_STEPS do
    local entries = redis.call('ZREVRANGEBYSCORE', key, '(' .. fmt(budget.cs), '-inf', 'WITHSCORES', 'LIMIT', offset, size)
    for i = 1, #entries, 2 do
      local score = tonumber(entries[i + 1])
      if group_score and score ~= group_score then
        -- group_score's group is complete and holds `need` (its prefix is `below`)
        answer = group_score
        budget.cs, budget.cp, budget.cg = group_score, below, group
        below = below - group
        if below < need then
          return answer
        end
        group = 0
      end
      group_score = score
      group = group + member_permits(entries[i])
      steps = steps + 1
    end
    if #entries < 2 * size then -- the start of the log: the last group read is the oldest
      if group_score then
        budget.cs, budget.cp, budget.cg = group_score, below, group
        return group_score
      end
      return answer
    end
    offset = offset + size
    size = min(size * 4, WALK_STEPS - steps + 1)
  end
  -- Out of steps: the group being read holds `need` too, but it may not be the oldest.
  return group_score or answer
end

-- Microseconds from `now` until `need` more permits have left the window.
local function wait_for(budget, need, interval, now)
  flush_log(budget)
  local at
  if budget.cs and budget.cp >= need then
    at = walk_back(budget, need)
  else
    at = walk_forward(budget, need)
  end
  if not at then
    return interval -- the log holds fewer permits than `used` says: it was tampered with
  end
  return max(at + interval - now, 1)
end
