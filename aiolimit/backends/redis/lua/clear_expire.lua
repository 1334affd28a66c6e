-- clear_expire: removes the config's TTL (set by expire(), or by keep_alive, which the next
-- grant sets again), and gives the OVERALL state back the TTL it would have had without
-- expire(): one interval past its newest grant (an OVERALL token bucket's or fixed windows'
-- state is in the config hash, and lives as long). PER_CLIENT clients' keys get theirs from
-- the caller, in chunks (refresh.lua).
--
-- KEYS[1] config hash, KEYS[2] value key, KEYS[3] permits ZSET (OVERALL)
-- ARGV[1] now in microseconds, or '' to read the server's TIME
--
-- Returns 1 when the config had a TTL, 0 when it had none or does not exist.

local config = load_config(KEYS[1])
if not config then
  return 0
end
local had_ttl = redis.call('PERSIST', KEYS[1])
redis.call('HDEL', KEYS[1], 'expires_at')
config.expires_at = nil
refresh_group(KEYS[2], KEYS[3], config, now_us(ARGV[1]))
return had_ttl
