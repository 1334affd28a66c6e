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
local config, trouble = budget_config(KEYS[1], ARGV[3])
if not config then
  return trouble
end
local now = limiter_now(config, ARGV[2])
save_clock(config)
local group = load_group(config, KEYS[2], KEYS[3], true)
group.algorithm.reclaim(group, now, true)
local released = group.algorithm.release(group, tonumber(ARGV[1]), ARGV[4], now)
group.algorithm.save(group, now)
-- The receipt outlives any resend a client library could still have on its way (it may
-- outlive the limiter too, so a late resend cannot release a recreated limiter's permits).
redis.call('SET', KEYS[4], fmt(released), 'PX', 60000)
return { 0, released }
