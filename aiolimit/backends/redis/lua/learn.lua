-- learn: the rate in force learned from a partner's answers, one decision for the whole
-- fleet (backends/_learning.py states the law; the memory twin runs it in Python).
--
-- KEYS[1] config hash
-- KEYS[2] value key (OVERALL)
-- KEYS[3] permits ZSET (OVERALL)
-- KEYS[4] the learned state: "<tag>:learn" (a hash)
-- ARGV[1] event: 'read', 'refused', 'succeeded' or 'stated'
-- ARGV[2] refused, succeeded: when the call's grant was decided (us, limiter clock; '' unknown);
--         stated: the quota the partner states ('' none)
-- ARGV[3] stated: the quota's window (us)
-- ARGV[4] now in microseconds, or '' to read the server's TIME
-- ARGV[5] the ceiling, "<permits>:<interval us>,..." ('' the stored one, else the config's)
-- ARGV[6] floor, ARGV[7] start, ARGV[8] decrease, ARGV[9] step: shares in millionths
-- ARGV[10] max_hold (us)
--
-- The config's rates are the ceiling's, each scaled by permits / C (C: the ceiling's first
-- rate's permits); when they change, only the fields 'rate' and 'rates' are rewritten and the
-- state is kept as set_rate's keep_state keeps it (a block, a TTL, the clock stay). A learned
-- state that is missing, has another ceiling, or no longer matches the config (another writer
-- replaced it) starts again: at `start` of the ceiling, or the config's rate where lower.
-- O(1): one budget's reclaim and save, bounded as every script's.
--
-- Returns {0, permits, C, interval, changed, cut_at, good, bad, hold, stated, grown_at}, {-1} without
-- config, {-5, text} when the ceiling's intervals are not the config's.

local MILLION = 1000000
local LEARN_TTL_MS = 86400000
local FIELDS = {
  'ceiling', 'permits', 'good', 'bad', 'peak', 'peak_bad', 'peak_hold', 'step', 'hold', 'cut_at', 'grown_at', 'stated',
  'refusals', 'level',
}

local function rates_text(rates)
  local parts = {}
  for i, r in ipairs(rates) do
    parts[i] = fmt(r.rate) .. ':' .. fmt(r.interval)
  end
  return table.concat(parts, ',')
end

local function parse_ceiling(text)
  local rates = {}
  for p, i in string.gmatch(text, '(%d+):(%d+)') do
    rates[#rates + 1] = { rate = tonumber(p), interval = tonumber(i) }
  end
  return rates
end

local function share(top, millionths)
  return max(1, floor(top * millionths / MILLION))
end

-- The rates in force when the first has `permits`: each of the ceiling's scaled alike.
local function rates_of(ceiling, permits)
  local rates = {}
  for i, r in ipairs(ceiling) do
    rates[i] = { rate = max(1, floor(r.rate * permits / ceiling[1].rate)), interval = r.interval }
  end
  return rates
end

local config = load_config(KEYS[1])
if not config then
  return { -1 }
end
local now = limiter_now(config, ARGV[4])
local law = {
  floor = tonumber(ARGV[6]), start = tonumber(ARGV[7]), decrease = tonumber(ARGV[8]),
  step = tonumber(ARGV[9]), max_hold = tonumber(ARGV[10]),
}
local stored = redis.call('HMGET', KEYS[4], unpack(FIELDS))
local state = {}
for i, name in ipairs(FIELDS) do
  state[name] = i == 1 and stored[i] or tonumber(stored[i] or '')
end
for i = 3, #FIELDS do -- (a state an earlier release wrote lacks the newer fields)
  state[FIELDS[i]] = state[FIELDS[i]] or 0
end
-- The config's exact rates: as stored, before the fleet's measured margin widens them
-- (margin.lua); a learned rate is written exact and read widened, as the rate it replaces.
local widen, exact = tonumber(config.margin or '') or 0, {}
for i = 1, #config.rates do
  exact[i] = { rate = config.rates[i].rate, interval = config.rates[i].interval - widen }
end
local ceiling_text = ARGV[5] ~= '' and ARGV[5] or state.ceiling or rates_text(exact)
local ceiling = parse_ceiling(ceiling_text)
local current = rates_text(exact)
for i = 1, max(#ceiling, #exact) do
  if not (ceiling[i] and exact[i] and ceiling[i].interval == exact[i].interval) then
    return { -5, ceiling_text .. ' / ' .. current }
  end
end
local top, interval = ceiling[1].rate, ceiling[1].interval

if not (state.permits and state.ceiling == ceiling_text and rates_text(rates_of(ceiling, state.permits)) == current) then
  state = {
    permits = max(share(top, law.floor), min(config.rates[1].rate, share(top, law.start), top)),
    good = 0, bad = 0, peak = 0, peak_bad = 0, peak_hold = 0, refusals = 0, level = 0, step = share(top, law.step), hold = interval, cut_at = 0, grown_at = now, stated = 0,
  }
end
local before = state.permits

-- The limit fell below `level`: the rate is cut to `permits`; where it fell from is kept
-- (unless a higher level it fell from is, or this episode kept it already), with what failed
-- above it and its wait.
local function fell(level, permits, held)
  if state.peak ~= level and (held or state.peak < level) then
    local above = state.bad > level
    state.peak = level
    state.peak_bad = above and state.bad or 0
    state.peak_hold = above and state.hold or interval
  end
  state.permits = permits
  state.good, state.bad, state.hold = 0, 0, interval
end

-- How long the level that just failed waits before it is tried again: below where the limit
-- fell from, doubling up to RECOVER_HOLDS intervals (a rise back is found soon); above every
-- level that held, max_hold (each probe there costs a 429).
local RECOVER_HOLDS = 4
local function next_hold()
  if state.peak > state.bad then
    return min(2 * state.hold, max(min(law.max_hold, RECOVER_HOLDS * interval), interval))
  end
  return max(law.max_hold, interval)
end

local function refused(decided)
  local episode
  if decided then
    episode = decided <= state.cut_at
  else
    episode = now < state.cut_at + floor(interval / 4) -- (no grant to tell by)
  end
  local least = share(top, law.floor)
  local first = not (state.cut_at ~= 0 and episode)
  if not first then -- the cut made answers it, unless the episode is a fall
    state.refusals = state.refusals + 1
  elseif state.good > 0 and state.good < state.permits then -- a probe failed: back, wait longer
    state.bad, state.permits, state.level = state.permits, state.good, state.good
    state.hold = next_hold()
    state.refusals = 1 - (state.bad - state.good) -- (its overshoot's refusals are its own)
  else -- a level in force refused: a late arrival, a step down; a fall, halved
    local level, held = state.permits, state.good > 0
    local step = held and share(top, law.step) or (level - floor(level * law.decrease / MILLION))
    fell(level, max(least, level - step), held)
    state.refusals, state.level = 1, level
  end
  local deep = max(least, floor(state.level * law.decrease / MILLION))
  local fall = state.refusals > floor(state.level / 4) and state.permits > deep -- a window refused
  if fall then
    fell(state.level, deep, true)
  end
  if fall or first then
    state.step = share(top, law.step)
    state.cut_at, state.grown_at = now, now
  end
end

local function succeeded(decided)
  if decided - state.grown_at < interval then
    return -- (a probe's extra call fails an interval after the raise: not proven before)
  end
  state.good = state.permits -- it held an interval
  if state.bad > 0 and state.permits >= state.bad then -- the bad level held: the limit rose
    state.bad, state.hold = 0, interval
    if state.peak > state.permits then -- back to where it fell from, at once
      state.step = max(state.step, state.peak - state.permits)
    end
  end
  local cap = state.stated > 0 and min(top, state.stated) or top
  if state.peak <= state.permits then
    state.peak = 0
  end
  local target = state.permits + state.step
  if state.bad > 0 then -- a level known to fail: crept up to, itself tried after the hold
    target = min(target, state.bad)
  elseif state.peak > 0 then -- below where the limit fell from: never past it
    target = min(target, state.peak)
  end
  target = min(target, cap)
  if target <= state.permits then
    return
  end
  local wait = (state.bad > 0 and target >= state.bad) and state.hold or interval
  if now - state.grown_at < wait then
    return
  end
  if state.peak > 0 and target >= state.peak then -- back: what failed above it fails as before
    state.bad, state.hold, state.peak = state.peak_bad, state.peak_hold, 0
    state.step = share(top, law.step)
  elseif state.peak > 0 then -- (a fall's first step is small, then doubling: a rise found fast)
    state.step = 2 * state.step
  elseif state.bad == 0 then -- (a step overshoots by as much: an eighth at most)
    state.step = max(share(top, law.step), min(2 * state.step, floor(target / 8)))
  end
  state.permits, state.grown_at = target, now
end

local function stated(quota, per)
  local s = floor(quota * interval / per)
  if s < 1 then
    return -- a limit that allows nothing is no limit we believe
  end
  s = max(share(top, law.floor), min(s, top))
  state.stated = s
  if s < state.permits then
    state.cut_at = now
  end
  if s ~= state.permits then
    state.permits, state.good, state.bad, state.grown_at = s, 0, 0, now
  end
end

local event = ARGV[1]
if event == 'refused' then
  refused(tonumber(ARGV[2]))
elseif event == 'succeeded' then
  local left -- a rate a quarter unused is not proven by the calls that succeed under it
  if config.type == 'OVERALL' then
    local group = load_group(config, KEYS[2], KEYS[3], false)
    group.algorithm.reclaim(group, now, false)
    left = group.algorithm.left(group, now)
  end
  if not left or 4 * left <= state.permits then
    succeeded(min(tonumber(ARGV[2]) or now, now))
  end
elseif event == 'stated' and tonumber(ARGV[2]) and tonumber(ARGV[3]) and tonumber(ARGV[3]) > 0 then
  stated(tonumber(ARGV[2]), tonumber(ARGV[3]))
end

local changed = state.permits ~= before and 1 or 0
redis.call('HSET', KEYS[4], 'ceiling', ceiling_text, 'permits', fmt(state.permits), 'good', fmt(state.good),
  'bad', fmt(state.bad), 'peak', fmt(state.peak), 'peak_bad', fmt(state.peak_bad), 'peak_hold', fmt(state.peak_hold),
  'step', fmt(state.step), 'hold', fmt(state.hold), 'cut_at', fmt(state.cut_at),
  'grown_at', fmt(state.grown_at), 'stated', fmt(state.stated), 'refusals', fmt(state.refusals), 'level', fmt(state.level))
redis.call('PEXPIRE', KEYS[4], LEARN_TTL_MS)

local wanted = rates_of(ceiling, state.permits)
if rates_text(wanted) ~= current then
  -- The new rates, the state kept (groups.lua): grants made stay counted.
  redis.call('HSET', KEYS[1], 'rate', fmt(wanted[1].rate))
  if #wanted > 1 then
    redis.call('HSET', KEYS[1], 'rates', rates_text(wanted))
  end
  config = rates_rewritten(config, KEYS[1], KEYS[2], KEYS[3], now)
  changed = 1
end
if config.clock_moved or (config.clock and ARGV[4] ~= '') then
  redis.call('HSET', KEYS[1], 'clock', fmt(config.clock))
end
return { 0, state.permits, top, interval, changed, state.cut_at, state.good, state.bad, state.hold, state.stated, state.grown_at }
