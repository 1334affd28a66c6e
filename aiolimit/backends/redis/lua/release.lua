-- release: hands permits back before their grants expire. Safe to run twice: a client
-- library that sends the call again (after a timeout, say) releases nothing more.
--
-- KEYS[1] config hash
-- KEYS[2] value key      (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET   (the client's own for PER_CLIENT)
-- KEYS[4] this release's receipt: "<tag>:released:<release id>", a fresh id per call
-- ARGV[1] permits to hand back
-- ARGV[2] now in microseconds, or '' to read the server's TIME
-- ARGV[3] rate type the caller built KEYS for
-- ARGV[4] member of one exact grant to remove (a cancelled caller's, even a reservation),
--         or '' to take from the most recent grants that have started
--
-- The released permits are removed from their log entries, so they cannot return a second
-- time when the entries would have expired, and left never exceeds the rate. At most
-- WALK_STEPS grants are handed back per call.
-- Returns {0, released}, {-1} without config, {-3, type} for the other rate type.

local done = redis.call('GET', KEYS[4])
if done then
  return { 0, tonumber(done) }
end
local config = load_config(KEYS[1])
if not config then
  return { -1 }
end
if config.type ~= ARGV[3] then
  return { -3, config.type }
end
local now = limiter_now(config, ARGV[2])
save_clock(config)
local key = KEYS[3]
local budget = load_budget(KEYS[2], key, config, true)
reclaim(budget, now - config.interval, true)
local wanted = tonumber(ARGV[1])
local released = 0

local function take(member, score, permits)
  redis.call('ZREM', key, member)
  cursor_moved(budget, score, -permits)
  released = released + permits
end

if ARGV[4] ~= '' then
  local score = redis.call('ZSCORE', key, ARGV[4])
  if score then
    take(ARGV[4], tonumber(score), member_permits(ARGV[4]))
  end
else
  -- Reservations (grants starting in the future) belong to waiting callers: never touched.
  local entries = redis.call('ZREVRANGEBYSCORE', key, fmt(now), '-inf', 'WITHSCORES', 'LIMIT', 0, WALK_STEPS)
  for i = 1, #entries, 2 do
    if released >= wanted then
      break
    end
    local member, score = entries[i], tonumber(entries[i + 1])
    local permits = member_permits(member)
    local rest = permits - math.min(permits, wanted - released)
    take(member, score, permits - rest)
    if rest > 0 then
      redis.call('ZADD', key, fmt(score), fmt(rest) .. ':' .. member_id(member))
    end
  end
end

if released > 0 or budget.dirty then
  budget.used = budget.used - released
  save_budget(budget, config, now)
end
-- The receipt outlives any resend a client library could still have on its way (it may
-- outlive the limiter too, so a late resend cannot release a recreated limiter's permits).
redis.call('SET', KEYS[4], fmt(released), 'PX', 60000)
return { 0, released }
