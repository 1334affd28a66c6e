-- retire: removes the state of clients of a retired registry (after delete, or a set_rate
-- that cleared the state), one chunk at a time so that no call runs long.
--
-- KEYS[1] config hash
-- KEYS[2] the retired registry ("<tag>:retired:<gen>")
-- KEYS[3..] value key, permits ZSET of each client in ARGV, in the same order
-- ARGV[1..] client ids (a chunk of KEYS[2])
--
-- A client whose state belongs to the current config's generation (it came back after the
-- reset) keeps it; every other client's keys are removed. Each id leaves KEYS[2].
-- Returns the number of ids left in KEYS[2].

local config = load_config(KEYS[1])
-- (no generation: none live; a token bucket's client may hold any rates epoch of it)
local live = config and config.gen ~= '-' and split_gen(config.gen)
for i, id in ipairs(ARGV) do
  local value_key, permits_key = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local raw = redis.call('GET', value_key)
  if not (live and raw and split_gen(match(raw, '^%S*')) == live) then
    redis.call('UNLINK', unpack(all_rate_keys(KEYS[1], value_key, permits_key)))
  end
  redis.call('ZREM', KEYS[2], id)
end
return redis.call('ZCARD', KEYS[2])
