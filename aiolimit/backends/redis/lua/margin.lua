-- margin: the fleet's measured margin, kept in the config hash ('margin', 'margin_at': us)
-- and added to every interval when a script reads the config (load_config);
-- backends/_margin.py states the law, and the memory twin runs it in Python.
--
-- KEYS[1] config hash
-- KEYS[2] value key (OVERALL)
-- KEYS[3] permits ZSET (OVERALL)
-- ARGV[1] the lateness a process reports (us), or '' to begin: the start where none is
-- ARGV[2] now in microseconds, or '' to read the server's TIME
-- ARGV[3] start (us), ARGV[4] cap (millionths of the shortest interval), ARGV[5] shrink
--         (intervals of the first rate), ARGV[6] quantum (us), ARGV[7] floor (millionths of
--         the shortest interval), ARGV[8] the floor's most (us)
--
-- A change is made as set_rate's keep_state makes one: grants made stay counted. A
-- PER_CLIENT limiter, or fixed windows (whose windows would move), keep none.
-- O(1): one budget's reclaim and save, bounded as every script's.
--
-- Returns {0, margin}, {-1} without config.

local config = load_config(KEYS[1])
if not config then
  return { -1 }
end
if config.type ~= 'OVERALL' or ALGORITHMS[config.algorithm].fixed_edges then
  return { 0, 0 }
end
local now = limiter_now(config, ARGV[2])
local start, cap_share, shrink, quantum = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local floor_share = tonumber(ARGV[7]) or 0
local before = tonumber(config.margin or '')
local margin, at = before, tonumber(config.margin_at or '0') or 0

-- the exact rates: the config's, less the margin they were read with
local shortest = config.rates[1].interval
for _, r in ipairs(config.rates) do
  shortest = min(shortest, r.interval)
end
local widen = before or 0
shortest = shortest - widen
local cap = floor(shortest * cap_share / 1000000)
local least = min(floor(shortest * floor_share / 1000000), tonumber(ARGV[8]), cap)
if not margin then
  margin, at = start, now
end
margin = min(max(margin, least), cap)
local late = tonumber(ARGV[1])
if late then
  late = min(max(floor(late), least), cap)
  if late > margin then
    margin, at = late, now
  else
    local shrink_time = max(shrink * (config.rates[1].interval - widen), 1)
    local elapsed = min(max(now - at, 0), shrink_time)
    local target = margin - floor((margin - late) * elapsed / shrink_time)
    if margin - target >= quantum then
      margin, at = target, now
    end
  end
end

-- (none before, and none to keep: nothing written)
if (before or margin > 0) and (margin ~= before or tonumber(config.margin_at or '') ~= at) then
  redis.call('HSET', KEYS[1], 'margin', fmt(margin), 'margin_at', fmt(at))
end
if margin ~= widen then -- (the new intervals: groups.lua)
  config = rates_rewritten(config, KEYS[1], KEYS[2], KEYS[3], now)
end
if config.clock_moved or (config.clock and ARGV[2] ~= '') then
  redis.call('HSET', KEYS[1], 'clock', fmt(config.clock))
end
return { 0, margin }
