-- refresh: gives a chunk of PER_CLIENT clients the TTLs the current config gives them (after
-- expire, clear_expire, or a longer interval), and the registry one that outlives them all.
--
-- KEYS[1] config hash
-- KEYS[2] clients registry
-- KEYS[3..] value key, permits ZSET of each client in ARGV[2..], in the same order
-- ARGV[1] now in microseconds, or '' to read the server's TIME
-- ARGV[2..] client ids (a chunk of the registry)
--
-- Returns how many clients were refreshed (0 without config).

local config = load_config(KEYS[1])
if not config then
  return 0
end
local now = now_us(ARGV[1])
local longest = 0
for i = 2, #ARGV do
  longest = max(longest, refresh_group(KEYS[2 * i - 1], KEYS[2 * i], config, now))
end
if longest > 0 then
  extend_registry(KEYS[2], longest + ms(config.longest), config, now)
end
return #ARGV - 1
