-- set_rate: writes the config (try / set / update) and keeps or clears the state.
--
-- KEYS[1] config hash
-- KEYS[2] value key (OVERALL)
-- KEYS[3] permits ZSET (OVERALL)
-- KEYS[4] clients registry
-- KEYS[5] where the registry goes when the state is cleared: "<tag>:retired:<gen>"
-- ARGV[1] mode: 'try' (only without config), 'set' (always), 'update' (only with config)
-- ARGV[2] rate type: 'OVERALL' or 'PER_CLIENT'
-- ARGV[3] rate, ARGV[4] interval (us), ARGV[5] keep_alive (us, '0' for none)
-- ARGV[6] keep_state: '1' keeps grants inside the new window, '0' clears every budget
-- ARGV[7] now in microseconds, or '' to read the server's TIME
-- ARGV[8] a fresh generation, unique to this call (used when the state is cleared)
--
-- O(1) however many PER_CLIENT clients there are. Clearing the state starts a new
-- generation: every client's state of the old one is dead at once, and the registry is
-- renamed to KEYS[5] for the caller to remove their keys in chunks (retire.lua). Keeping it,
-- each client's state follows the new rate at its next grant (`used` does not depend on the
-- rate); only a longer interval needs their TTLs lengthened, in chunks (refresh.lua).
--
-- Returns {written, follow}: written 1, or 0 when not written (try: a config exists; update:
-- none exists); follow 0 nothing to do, 1 refresh every client's TTL, 2 retire KEYS[5].

local mode = ARGV[1]
local old = redis.call('HMGET', KEYS[1], 'type', 'gen', 'interval', 'clock')
local old_type = old[1]
if (mode == 'try' and old_type) or (mode == 'update' and not old_type) then
  return { 0, 0 }
end

local rate_type, interval, keep_alive = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5])
-- Changing the rate type clears the state: the budgets are not comparable. So does a new
-- config where none was: state left by an expired or deleted limiter belongs to no limiter.
local keep = ARGV[6] == '1' and old_type == rate_type
local gen = keep and old[2] or ARGV[8]
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'rate', ARGV[3], 'interval', ARGV[4], 'type', rate_type, 'gen', gen)
if keep_alive > 0 then
  redis.call('HSET', KEYS[1], 'keep_alive', ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ms(keep_alive))
end

local follow = 0
local clock = old[4]
if keep then
  local config = load_config(KEYS[1])
  config.clock = clock and tonumber(clock)
  local now = limiter_now(config, ARGV[7])
  clock = config.clock and fmt(config.clock)
  local budget = load_budget(KEYS[2], KEYS[3], config, true)
  reclaim(budget, now - interval, true)
  if not budget.fresh then
    save_budget(budget, config, now)
  end
  if old[3] and interval > tonumber(old[3]) and redis.call('EXISTS', KEYS[4]) == 1 then
    follow = 1
  end
else
  redis.call('UNLINK', KEYS[2], KEYS[3])
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('RENAME', KEYS[4], KEYS[5])
    follow = 2
  end
end
if clock then
  redis.call('HSET', KEYS[1], 'clock', clock) -- a new config keeps the clients' latest time
end
return { 1, follow }
