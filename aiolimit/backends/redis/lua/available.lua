-- available: permits a request could take right now. Read-only.
--
-- KEYS[1] config hash
-- KEYS[2] value key      (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET   (the client's own for PER_CLIENT)
-- ARGV[1] now in microseconds, or '' to read the server's TIME
-- ARGV[2] rate type the caller built KEYS for
--
-- Returns {0, left} (left may be negative while reservations are queued or after the rate
-- was lowered), {-1} without config, {-3, type} when KEYS were built for the other rate type.

local config, trouble = budget_config(KEYS[1], ARGV[2])
if not config then
  return trouble
end
local now = limiter_now(config, ARGV[1]) -- nothing written: a read acts on no state
local group = load_group(config, KEYS[2], KEYS[3], false)
group.algorithm.reclaim(group, now, false)
local left = group.algorithm.left(group, now)
if (config.spacing > 0 or config.blocked_until) and earliest(group, 1, now) > now then
  left = min(left, 0) -- the spacing or a block holds the next grant back
end
return { 0, left }
