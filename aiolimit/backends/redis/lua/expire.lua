-- expire: makes the whole limiter disappear after ttl (state keys whose grants leave the
-- window sooner keep the shorter TTL those give them).
--
-- KEYS[1] config hash, KEYS[2] value key, KEYS[3] permits ZSET (OVERALL), KEYS[4] registry
-- ARGV[1] ttl in milliseconds
-- ARGV[2] now in microseconds, or '' to read the server's TIME
--
-- The end is also written into the config (`expires_at`), so that no grant made meanwhile
-- gives the state a TTL beyond it (nor slides a keep_alive past it). PER_CLIENT clients'
-- keys are given it by the caller, in chunks (refresh.lua).
--
-- Returns 1 when the config exists, 0 when it does not (nothing is changed).

local config = load_config(KEYS[1])
if not config then
  return 0
end
local ttl = tonumber(ARGV[1])
local now = now_us(ARGV[2])
config.expires_at = now + ttl * 1000
redis.call('HSET', KEYS[1], 'expires_at', fmt(config.expires_at))
redis.call('PEXPIRE', KEYS[1], ttl)
-- The OVERALL state: the TTL its grants need, cut at the new end (a later end gives back
-- what an earlier expire() took). A token bucket's or fixed windows' is in the config hash.
refresh_group(KEYS[2], KEYS[3], config, now)
local current = redis.call('PTTL', KEYS[4])
if current == -1 or current > ttl then
  redis.call('PEXPIRE', KEYS[4], ttl)
end
return 1
