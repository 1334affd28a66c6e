-- retire: removes the state of clients of a retired registry (after delete, or a set_rate
-- that cleared the state), one chunk at a time so that no call runs long.
--
-- KEYS[1] config hash
-- KEYS[2] the retired registry ("<tag>:retired:<gen>")
-- KEYS[3..] value key, permits ZSET of each client in ARGV, in the same order
-- KEYS[#KEYS] the clients registry
-- ARGV[1] now in microseconds, or '' to read the server's TIME
-- ARGV[2..] client ids (a chunk of KEYS[2])
--
-- A client whose state belongs to the current config's generation (it came back after the
-- reset) keeps it; every other client's keys are removed. Each id leaves KEYS[2]. A client
-- whose latest grant lies ahead (set_rate.lua's 'promised') is given its new budget with a
-- grant of the new rate at that start, and joins the registry.
-- Returns the number of ids left in KEYS[2].

local config = load_config(KEYS[1])
-- (no generation: none live; a token bucket's client may hold any rates epoch of it)
local live = config and config.gen ~= '-' and split_gen(config.gen)
local promised = live and config.type == 'PER_CLIENT' and config.promised
local now = promised and limiter_now(config, ARGV[1])
for i = 1, #ARGV - 1 do
  local id, value_key, permits_key = ARGV[i + 1], KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local raw = redis.call('GET', value_key)
  if not (live and raw and split_gen(match(raw, '^%S*')) == live) then
    redis.call('UNLINK', unpack(all_rate_keys(KEYS[1], value_key, permits_key)))
    local latest = promised and tonumber(redis.call('ZSCORE', KEYS[2], id))
    if latest and latest > now then
      local group = load_group(config, value_key, permits_key, true)
      group.algorithm.commit(group, config.max_permits, latest)
      local ttl = group.algorithm.save(group, now)
      redis.call('ZADD', KEYS[#KEYS], fmt(latest), id)
      extend_registry(KEYS[#KEYS], ttl + ms(config.longest), config, now)
    end
  end
  redis.call('ZREM', KEYS[2], id)
end
return redis.call('ZCARD', KEYS[2])
