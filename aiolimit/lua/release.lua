-- release: hands permits back before their grants expire.
--
-- KEYS[1] config hash
-- KEYS[2] value key      (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET   (the client's own for PER_CLIENT)
-- ARGV[1] permits to hand back
-- ARGV[2] now in microseconds, or '' to read the server's TIME
-- ARGV[3] rate type the caller built KEYS for
-- ARGV[4] member of one exact grant to remove (a cancelled caller's, even a reservation),
--         or '' to take from the most recent grants that have started
--
-- The released permits are removed from their log entries, so they cannot return a second
-- time when the entries would have expired, and left never exceeds the rate.
-- Returns {0, released}, {-1} without config, {-3, type} for the other rate type.

local config = load_config(KEYS[1])
if not config then
  return { -1 }
end
if config.type ~= ARGV[3] then
  return { -3, config.type }
end
local now = limiter_now(config, ARGV[2])
save_clock(config)
local left = reclaim(KEYS[2], KEYS[3], config.rate, now - config.interval, true)
local wanted = tonumber(ARGV[1])
local released = 0

if ARGV[4] ~= '' then
  if redis.call('ZREM', KEYS[3], ARGV[4]) == 1 then
    released = member_permits(ARGV[4])
  end
else
  while released < wanted do
    -- Reservations (grants starting in the future) belong to waiting callers: never touched.
    local newest = redis.call('ZREVRANGEBYSCORE', KEYS[3], fmt(now), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if #newest == 0 then
      break
    end
    local member, score = newest[1], newest[2]
    local permits = member_permits(member)
    redis.call('ZREM', KEYS[3], member)
    local take = math.min(permits, wanted - released)
    if take < permits then
      add_unique(KEYS[3], score, (permits - take) .. ':' .. member_id(member))
    end
    released = released + take
  end
end

if released > 0 then
  store(KEYS[2], KEYS[3], left + released, config.interval, now, config.expires_at)
end
return { 0, released }
