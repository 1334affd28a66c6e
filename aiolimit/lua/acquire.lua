-- acquire: grants `permits` if the window has room, else says how long until it will.
--
-- KEYS[1] config hash
-- KEYS[2] value key         (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET      (the client's own for PER_CLIENT)
-- KEYS[4] clients registry  (PER_CLIENT only)
-- ARGV[1] permits to take (integer >= 1)
-- ARGV[2] now in microseconds, or '' to read the server's TIME
-- ARGV[3] rate type the caller built KEYS for: 'OVERALL' or 'PER_CLIENT'
-- ARGV[4] client id (PER_CLIENT only)
--
-- Returns {code, a, b, now, member}:
--   { 0, left, next_free, now, member }  granted; next_free = us until another permit frees
--                                        (0 while permits are left); member = the grant's entry
--   { 1, wait, left, now }               refused; wait = us until `permits` are free
--   {-1}                                 no config
--   {-2, rate}                           permits exceed the rate
--   {-3, type}                           KEYS were built for the other rate type

local permits = tonumber(ARGV[1])
local config = load_config(KEYS[1])
if not config then
  return { -1 }
end
if config.type ~= ARGV[3] then
  return { -3, config.type }
end
if permits > config.rate then
  return { -2, config.rate }
end

local now = now_us(ARGV[2])
local interval = config.interval
local left = reclaim(KEYS[2], KEYS[3], config.rate, now - interval, true)

if left < permits then
  return { 1, wait_for(KEYS[3], permits - left, interval, now), left, now }
end

local member = log_grant(KEYS[3], permits, now)
left = left - permits
redis.call('SET', KEYS[2], fmt(left), 'PX', ms(interval))
redis.call('PEXPIRE', KEYS[3], ms(interval))
if config.type == 'PER_CLIENT' then
  redis.call('ZADD', KEYS[4], fmt(now), ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', fmt(now - 2 * interval))
  redis.call('PEXPIRE', KEYS[4], ms(2 * interval))
end
if config.keep_alive > 0 then
  redis.call('PEXPIRE', KEYS[1], ms(config.keep_alive))
end

local next_free = 0
if left <= 0 then
  next_free = next_expiry(KEYS[3], interval, now)
end
return { 0, left, next_free, now, member }
