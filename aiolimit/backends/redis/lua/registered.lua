-- What settle.lua and sync.lua do for a PER_CLIENT client whose state they wrote (a TTL > 0,
-- in ms): the clients registry notes it, as batch.lua's close_group does for a grant (scored
-- by `now`, never moved back), so that set_rate and delete find the client's state.
local function register_client(config, registry_key, client_id, now, ttl)
  if config.type ~= 'PER_CLIENT' or ttl <= 0 then
    return
  end
  local score = redis.call('ZSCORE', registry_key, client_id)
  if not score or tonumber(score) < now then
    redis.call('ZADD', registry_key, fmt(now), client_id)
  end
  redis.call('ZREMRANGEBYSCORE', registry_key, '-inf', fmt(now - 2 * config.longest))
  extend_registry(registry_key, ttl + ms(config.longest), config, now)
end
