-- clear_expire: removes the config's TTL (set by expire(), or by keep_alive, which the next
-- grant sets again), and gives every budget's state back the TTL it would have had without
-- expire(): one interval past its newest grant.
--
-- KEYS as for delete.lua
-- ARGV[1] now in microseconds, or '' to read the server's TIME
-- ARGV[2..] every client id in the registry
--
-- Returns 1 when the config had a TTL, 0 when it had none or does not exist, -1 when the
-- registry names a client missing from ARGV.

local config = load_config(KEYS[1])
if not config then
  return 0
end
if not registry_covered(KEYS[4], 2) then
  return -1
end
local had_ttl = redis.call('PERSIST', KEYS[1])
redis.call('HDEL', KEYS[1], 'expires_at')
local now = now_us(ARGV[1])
local interval = config.interval
local function restore(value_key, permits_key)
  local left = redis.call('GET', value_key)
  if left then
    return store(value_key, permits_key, tonumber(left), interval, now)
  end
  return 0
end
restore(KEYS[2], KEYS[3])
local clients = 0
for i = 5, #KEYS - 1, 2 do
  clients = math.max(clients, restore(KEYS[i], KEYS[i + 1]))
end
if clients > 0 then
  redis.call('PEXPIRE', KEYS[4], clients + ms(interval))
end
return had_ttl
