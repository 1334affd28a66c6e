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

local config = load_config(KEYS[1])
if not config then
  return { -1 }
end
if config.type ~= ARGV[3] then
  return { -3, config.type }
end
local permits = tonumber(ARGV[1])
if permits > config.rate then
  return { -2, config.rate }
end
local now = limiter_now(config, ARGV[2]) -- nothing written: a read acts on no state
local budget = load_budget(KEYS[2], KEYS[3], config, false)
local logged = budget.used
reclaim(budget, now - config.interval, false)
if budget.fresh or config.rate - budget.used >= permits then
  return { 0, 0 }
end
-- The walk counts the expired grants still logged, so it needs what the unreclaimed log says.
return { 0, wait_for(budget, permits - (config.rate - logged), config.interval, now) }
