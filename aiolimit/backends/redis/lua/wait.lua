-- wait: how long until a request for permits could be granted. Read-only: takes nothing.
--
-- KEYS[1] config hash
-- KEYS[2] value key      (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET   (the client's own for PER_CLIENT)
-- ARGV[1] permits
-- ARGV[2] now in microseconds, or '' to read the server's TIME
-- ARGV[3] rate type the caller built KEYS for
--
-- Returns {0, wait in us (0: now)}, {-1} without config, {-2, rate} when permits exceed the
-- rate, {-3, type} when KEYS were built for the other rate type.

local config, trouble = budget_config(KEYS[1], ARGV[3])
if not config then
  return trouble
end
local permits = tonumber(ARGV[1])
if permits > config.max_permits then
  return { -2, config.max_permits }
end
local now = limiter_now(config, ARGV[2]) -- nothing written: a read acts on no state
local group = load_group(config, KEYS[2], KEYS[3], false)
group.algorithm.reclaim(group, now, false)
local start = earliest(group, permits, now) or now
return { 0, start - now }
