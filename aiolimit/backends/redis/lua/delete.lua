-- delete: removes the limiter: its config (with an OVERALL token bucket's or fixed windows'
-- state in it), the OVERALL state keys and the clients registry.
--
-- KEYS[1] config hash, KEYS[2] value key, KEYS[3] permits ZSET (OVERALL), KEYS[4] registry
--         (the keys of a sliding window's other rates are named after KEYS[2] and KEYS[3])
-- KEYS[5] where the registry goes: "<tag>:retired:<gen>", fresh for this call
--
-- O(1) however many PER_CLIENT clients there are: without a config their state counts for
-- nothing (a new config starts a new generation), and the registry is renamed to KEYS[5] for
-- the caller to remove their keys in chunks (retire.lua).
-- Returns {existed, follow}: existed, how many of KEYS[1..4] existed; follow 1 when KEYS[5]
-- is to be retired.

local existed = redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('UNLINK', KEYS[1], unpack(all_rate_keys(KEYS[1], KEYS[2], KEYS[3])))
local follow = 0
if redis.call('EXISTS', KEYS[4]) == 1 then
  redis.call('RENAME', KEYS[4], KEYS[5])
  follow = 1
end
return { existed, follow }
