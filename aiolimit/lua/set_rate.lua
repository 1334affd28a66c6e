-- set_rate: writes the config (try / set / update) and keeps or clears the state.
--
-- KEYS[1] config hash
-- KEYS[2] value key (OVERALL)
-- KEYS[3] permits ZSET (OVERALL)
-- KEYS[4] clients registry
-- KEYS[5..] value key, permits ZSET of each client in ARGV[8..], in the same order
-- ARGV[1] mode: 'try' (only without config), 'set' (always), 'update' (only with config)
-- ARGV[2] rate type: 'OVERALL' or 'PER_CLIENT'
-- ARGV[3] rate, ARGV[4] interval (us), ARGV[5] keep_alive (us, '0' for none)
-- ARGV[6] keep_state: '1' keeps grants inside the new window, '0' clears every budget
-- ARGV[7] now in microseconds, or '' to read the server's TIME
-- ARGV[8..] every client id in the registry
--
-- Returns 1 written, 0 not written (try: a config exists; update: none exists),
-- -1 the registry names a client missing from ARGV: read it again and retry.

local mode = ARGV[1]
local old_type = redis.call('HGET', KEYS[1], 'type')
if (mode == 'try' and old_type) or (mode == 'update' and not old_type) then
  return 0
end
if not registry_covered(KEYS[4], 8) then
  return -1
end

local rate_type, rate, interval, keep_alive = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local clock = redis.call('HGET', KEYS[1], 'clock')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'rate', ARGV[3], 'interval', ARGV[4], 'type', rate_type)
if keep_alive > 0 then
  redis.call('HSET', KEYS[1], 'keep_alive', ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ms(keep_alive))
end

-- Changing the rate type clears the state: the budgets are not comparable. So does a new
-- config where none was: state left by an expired or deleted limiter belongs to no limiter.
local keep = ARGV[6] == '1' and old_type == rate_type
if keep then
  local config = { key = KEYS[1], clock = clock and tonumber(clock) }
  local now = limiter_now(config, ARGV[7])
  clock = config.clock and fmt(config.clock)
  recompute(KEYS[2], KEYS[3], rate, interval, now)
  local longest = 0
  for i = 5, #KEYS - 1, 2 do
    longest = math.max(longest, recompute(KEYS[i], KEYS[i + 1], rate, interval, now))
  end
  if longest > 0 then
    -- The registry must outlive every client's state, whose TTLs follow the new interval.
    redis.call('PEXPIRE', KEYS[4], longest + ms(interval))
  end
else
  for i = 2, #KEYS do
    redis.call('DEL', KEYS[i])
  end
end
if clock then
  redis.call('HSET', KEYS[1], 'clock', clock) -- a new config keeps the clients' latest time
end
return 1
