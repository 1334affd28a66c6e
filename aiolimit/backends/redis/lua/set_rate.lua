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
-- ARGV[8] a fresh generation, unique to this call (used when the state is cleared): the
--         life of the new state, which every grant's member names (lib.lua)
-- ARGV[9] algorithm: a name in ALGORITHMS (lib.lua)
-- ARGV[10] every rate, "<rate>:<interval us>,..." when there are several ('' for one)
-- ARGV[11] minimum spacing between grants' starts (us, '0' for none)
-- ARGV[12] max_debt: how far below zero a settle may charge (permits, '' for the default)
--
-- O(1) however many PER_CLIENT clients there are. Clearing the state starts a new
-- generation: every client's state of the old one is dead at once, and the registry is
-- renamed to KEYS[5] for the caller to remove their keys in chunks (retire.lua). Keeping it,
-- each client's state follows the new rate at its next grant (`used` does not depend on the
-- rate); only a longer interval (or what the algorithm's `rates_changed` says: a token
-- bucket's slower refill) needs their TTLs lengthened, in chunks (refresh.lua), the clients
-- whose latest grant is oldest first.
-- An OVERALL budget's state may be a field of the config hash (`in_hash`): the new config
-- carries it over when the state is kept, and simply lacks it when it is cleared. What new
-- rates do to the state kept is the algorithm's (`rates_changed`).
--
-- A reset forgets what was used, not what was promised: an OVERALL budget's reservations that
-- have not started yet keep their slots, and count against the new state as a grant of the
-- permits they hold (at most the new rate's) at the latest of their starts, so no window holds
-- more than the larger of the two rates. A PER_CLIENT reset cannot visit every client: while
-- any client's latest grant lies ahead, the config's field 'promised' ("<latest start>
-- <retired registry>") has each client whose state the reset cleared count a grant of the new
-- rate at its own latest start, found by retire.lua or by its next request (batch.lua).
--
-- Returns {written, follow}: written 1, or 0 when not written (try: a config exists; update:
-- none exists); follow 0 nothing to do, 1 refresh every client's TTL, 2 retire KEYS[5].

-- An OVERALL budget's reservations: {permits, latest start}, or nil (none, or no readable
-- config: a reset is how a broken one is replaced).
local function reservations_of(config_key, value_key, permits_key, now_arg)
  local ok, config = pcall(load_config, config_key)
  if not (ok and config and config.type == 'OVERALL') then
    return nil
  end
  local now = limiter_now(config, now_arg)
  local loaded, group = pcall(load_group, config, value_key, permits_key, false)
  if not loaded then
    return nil
  end
  local permits, latest = group.algorithm.queued(group, now)
  return permits and { permits, latest } or nil
end

-- The old config's rates ({rate, interval} each), from the HMGET below: as the scripts read
-- them, widened by the old config's measured margin (margin.lua), which the new one starts
-- without.
local function old_rates(old)
  local olds = {}
  local widen = tonumber(old[10] or '0') or 0
  for p, i in string.gmatch(old[6] or '', '(%d+):(%d+)') do
    table.insert(olds, { rate = tonumber(p), interval = tonumber(i) + widen })
  end
  if #olds == 0 and old[8] then
    olds[1] = { rate = tonumber(old[8]), interval = tonumber(old[3]) + widen }
  end
  return olds
end

local mode = ARGV[1]
local old = redis.call('HMGET', KEYS[1], 'type', 'gen', 'interval', 'clock', 'algorithm', 'rates', 'state', 'rate',
  'epochs', 'margin')
local old_type = old[1]
if (mode == 'try' and old_type) or (mode == 'update' and not old_type) then
  return { 0, 0 }
end

local rate_type, keep_alive, algorithm = ARGV[2], tonumber(ARGV[5]), ARGV[9]
-- Changing the rate type or the algorithm clears the state: the budgets are not comparable.
-- So does a new config where none was: state left by an expired or deleted limiter belongs
-- to no limiter.
local keep = ARGV[6] == '1' and old_type == rate_type and (old[5] or DEFAULT_ALGORITHM) == algorithm
local gen = keep and old[2] or ARGV[8]
local promised = not keep and old_type == 'OVERALL' and rate_type == 'OVERALL'
  and reservations_of(KEYS[1], KEYS[2], KEYS[3], ARGV[7])
redis.call('DEL', KEYS[1])
-- (the state in value keys belongs to the generation; every grant's member names it: lib.lua)
redis.call('HSET', KEYS[1], 'rate', ARGV[3], 'interval', ARGV[4], 'type', rate_type, 'gen', gen)
if algorithm ~= DEFAULT_ALGORITHM then
  redis.call('HSET', KEYS[1], 'algorithm', algorithm)
end
if ARGV[10] ~= '' then
  redis.call('HSET', KEYS[1], 'rates', ARGV[10])
end
if ARGV[11] ~= '0' then
  redis.call('HSET', KEYS[1], 'spacing', ARGV[11])
end
if ARGV[12] and ARGV[12] ~= '' then
  redis.call('HSET', KEYS[1], 'max_debt', ARGV[12]) -- (settle.lua)
end
if keep_alive > 0 then
  redis.call('HSET', KEYS[1], 'keep_alive', ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ms(keep_alive))
end

local follow = 0
local clock = old[4]
if keep then
  local config = load_config(KEYS[1])
  config.clock = clock and tonumber(clock)
  config.state = config.in_hash and old[7] or nil -- written back by save, if it lives
  local now = limiter_now(config, ARGV[7])
  clock = config.clock and fmt(config.clock)
  local group = load_group(config, KEYS[2], KEYS[3], true)
  group.algorithm.reclaim(group, now, true)
  local longer = group.algorithm.rates_changed(group, old_rates(old), old[9], now)
  group.algorithm.keep(group)
  if not group.fresh then
    group.algorithm.save(group, now)
  end
  -- A longer interval (or what the algorithm says: a bucket's slower refill): the clients'
  -- state must live longer.
  local old_longest = tonumber(old[3] or '0')
  for _, i in string.gmatch(old[6] or '', '(%d+):(%d+)') do
    old_longest = max(old_longest, tonumber(i))
  end
  longer = longer or (old[3] and config.longest > old_longest)
  if longer and redis.call('EXISTS', KEYS[4]) == 1 then
    follow = 1
  end
else
  redis.call('UNLINK', unpack(all_rate_keys(KEYS[1], KEYS[2], KEYS[3])))
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('RENAME', KEYS[4], KEYS[5])
    follow = 2
    local latest = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')[2]
    if latest and old_type == rate_type then
      local config = load_config(KEYS[1])
      config.clock = clock and tonumber(clock)
      if tonumber(latest) > limiter_now(config, ARGV[7]) then
        redis.call('HSET', KEYS[1], 'promised', latest .. ' ' .. KEYS[5])
      end
    end
  end
  if promised then
    local config = load_config(KEYS[1])
    config.clock = clock and tonumber(clock)
    local now = limiter_now(config, ARGV[7])
    local group = load_group(config, KEYS[2], KEYS[3], true)
    group.algorithm.commit(group, min(promised[1], config.max_permits), promised[2])
    group.algorithm.save(group, now)
  end
end
if clock then
  redis.call('HSET', KEYS[1], 'clock', clock) -- a new config keeps the clients' latest time
end
return { 1, follow }
