-- block: no grant to anyone starts before now + duration (all processes, all clients).
-- O(1): the end is kept in the config hash (and goes with it: delete, set_rate), and every
-- acquire starts no earlier. A later block never shortens an earlier one; only unblock
-- (ARGV[1] 'clear') ends one early.
--
-- KEYS[1] config hash
-- ARGV[1] duration in microseconds, '-' to only read how long the block has left, or
--         'clear' to remove the block (grants may start at once again)
-- ARGV[2] now in microseconds, or '' to read the server's TIME
--
-- Returns {0, microseconds until the block ends (0: none); for 'clear', until it would have
-- ended}, {-1} without config.

local config = load_config(KEYS[1])
if not config then
  return { -1 }
end
local now = limiter_now(config, ARGV[2])
local blocked_until = config.blocked_until or now
if ARGV[1] == 'clear' then
  redis.call('HDEL', KEYS[1], 'blocked_until')
elseif ARGV[1] ~= '-' then
  save_clock(config)
  blocked_until = max(blocked_until, now + tonumber(ARGV[1]))
  redis.call('HSET', KEYS[1], 'blocked_until', fmt(blocked_until))
end
return { 0, max(blocked_until - now, 0) }
