-- The shared core, prepended (with one file per algorithm after it) to every operation script
-- when it is loaded: the config, the clock, the formats, and (groups.lua, right after it) the
-- group functions that run a budget's algorithm through the ALGORITHMS table.
--
-- A budget is the whole limiter for OVERALL, one client for PER_CLIENT. How it keeps its
-- state is its algorithm's (sliding_window.lua, token_bucket.lua, fixed_window.lua, the last
-- two on counters.lua); every algorithm applies every rate of its config at once.
-- Times are integer microseconds. A grant may start in the future: a reservation made for a
-- caller that waits (see `acquire` in batch.lua); it counts like any other grant.
--
-- Nothing here may run long, however big the state: every loop over a log is bounded
-- (WALK_STEPS, RECLAIM_STEPS), and where a bound cuts a loop short the answer errs on the
-- safe side (a later slot, fewer permits), never towards granting more than the rate.
--
-- A config's generation ("gen") is written by set_rate when it starts every budget afresh
-- (a new config, a rate type change, no keep_state). State of another generation belongs to
-- no limiter: it is never counted, and is dropped when touched. So resetting or deleting a
-- limiter with 100 000 clients is O(1); their keys are removed afterwards in small chunks.
-- An OVERALL token bucket or fixed window keeps its state in the config hash itself (field
-- 'state', see counters.lua): it goes with the config, which has a generation all the same.
-- The generation is random, so it is also the life of the state (config.life): each grant's
-- member names it, and a settle or release of a grant of another life (from before a delete,
-- a reset or a flush) hands back nothing of this one's.
--
-- The reply codes, the formats and the bounds here are the protocol the Python twin follows
-- too: aiolimit/backends/_protocol.py states them again, and tests/test_protocol.py checks
-- that the two agree.

local MAX_EXACT = 9007199254740991 -- 2^53 - 1: Lua numbers are doubles
local WALK_STEPS = 1000 -- log entries one wait computation may read
local RECLAIM_STEPS = 1000 -- expired log entries one call may remove from a budget
-- (the same bounds as the text a command takes: a number passed to redis.call is formatted
-- again on every call)
local WALK_LIMIT, RECLAIM_LIMIT = WALK_STEPS .. '', RECLAIM_STEPS .. ''
local MAX_RATES = 8 -- rates one limiter applies at once
local CONFIG_FIELDS = 32 -- fields a config hash may have (it has 3 to 15)

local server_now -- read once per script call

-- The standard functions a request calls most, as upvalues: a global is two table reads away
-- (the globals, then string or math). A function library is loaded where the standard
-- libraries cannot be reached yet, so they are bound as each call starts.
local format, match, byte, max, min, floor, ceil

-- What every script call runs first (_scripts, _functions): forgets the last call's TIME and
-- binds the functions above.
local function begin_call()
  server_now = nil
  format, match, byte = string.format, string.match, string.byte
  max, min, floor, ceil = math.max, math.min, math.floor, math.ceil
end

-- The algorithms a config may name (docs/algorithms.md), each a table of the functions
-- below ("groups"), filled in by its own file.
local ALGORITHMS = {}
local DEFAULT_ALGORITHM = 'SLIDING_WINDOW'
-- (a config without the field 'algorithm' has the default: set_rate does not write it)

local function now_us(arg)
  if arg ~= nil and arg ~= '' and arg ~= '-' then
    return tonumber(arg)
  end
  if not server_now then
    local t = redis.pcall('TIME')
    if t.err then
      -- Said plainly, so the client can point to its clock='client' option.
      error('aiolimit: the server refused TIME in a script: ' .. t.err)
    end
    server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server_now
end

-- The time a call acts at. A client-supplied time older than one this limiter already acted
-- on is moved up to it: concurrent clients' requests may reach the server out of order, and
-- acting at an older time after newer grants were reclaimed would over-admit. The caller
-- writes config.clock back (save_clock).
local function limiter_now(config, arg)
  local now = now_us(arg)
  if arg == nil or arg == '' or arg == '-' then
    return now -- the server's TIME
  end
  if config.clock and now < config.clock then
    return config.clock
  end
  if not config.clock or now > config.clock then
    config.clock = now
    config.clock_moved = true
  end
  return now
end

-- (And the other way: a number a pattern captured, or a score Redis replied, is read with
-- `text + 0`, one conversion; tonumber converts a string twice, once to check it.)
--
-- An integer as text. A batch formats the same few numbers again and again (its time, the
-- window's start, permits, sequence numbers), and string.format is among the dearest calls
-- a script makes: the texts are kept, at most FMT_MAX of them (loaded as a function library,
-- from one call to the next: a cache of a pure function, emptied when full).
local FMT, FMT_KEPT, FMT_MAX = {}, 0, 512

local function fmt(n)
  local text = FMT[n]
  if text then
    return text
  end
  text = format('%d', n)
  if n == n then -- (NaN is no table key)
    if FMT_KEPT >= FMT_MAX then
      FMT, FMT_KEPT = {}, 0
    end
    FMT[n], FMT_KEPT = text, FMT_KEPT + 1
  end
  return text
end

local function ms(us)
  return ceil(us / 1000)
end

local function member_permits(member)
  local digit, colon = byte(member, 1, 2)
  if colon == 58 and digit and digit >= 48 and digit <= 57 then
    return digit - 48 -- "<d>:...": one digit (most grants are of a few permits), one C call
  end
  return tonumber(match(member, '^(%d+):'))
end

local function member_id(member)
  return match(member, '^%d+:(.*)$')
end

-- The reply to a granted request (batch.lua's `acquire`), with the member the grant is handed
-- back by in it: "<permits>:<start>:<tag>:<life>", the tag telling it from the budget's other
-- grants that start then, the life naming the state it was taken from (config.life; see
-- settle.lua) (_protocol.with_life); with the end of the limiter's latest block when it has
-- one. Joined from fmt's texts, which a batch mostly finds made (its time, permits, no
-- delay): a string.format costs about as much per number as the rest of a grant's Lua.
local function granted(left, binding, start, delay, permits, tag, life, blocked_until)
  local made = FMT -- (the texts fmt has: looked up here, one call fewer per number found)
  start = made[start] or fmt(start) -- (as text from here: the reply has it twice)
  local reply = '0 ' .. (made[left] or fmt(left)) .. ' ' .. (made[binding] or fmt(binding)) .. ' ' .. start .. ' '
    .. (made[delay] or fmt(delay)) .. ' ' .. (made[permits] or fmt(permits)) .. ':' .. start .. ':' .. (made[tag] or fmt(tag))
    .. ':' .. life
  if blocked_until then
    return reply .. ' ' .. fmt(blocked_until)
  end
  return reply
end

-- permits, start, tag of a grant's member without its life (nil when it is not one): what
-- the algorithms read.
local function parse_grant(member)
  local permits, start, tag = match(member, '^(%d+):(%d+):(%-?%d+)$')
  return tonumber(permits), tonumber(start), tonumber(tag)
end

-- A grant's member as the grant and its life (_protocol.split_life): a member without a life
-- (as an earlier version wrote them) is returned whole, its life nil: it names no life.
local function split_life(member)
  local grant, life = match(member, '^(%d+:%d+:%-?%d+):([%w_%-]+)$')
  if grant then
    return grant, life
  end
  return member, nil
end

-- The text of an error raised by redis.call or error(), without the script position.
local function error_text(e)
  if type(e) == 'table' then
    e = e.err or 'error'
  end
  e = string.gsub(tostring(e), '%s+', ' ')
  return match(e, 'aiolimit: (.*)$') or e
end

-- Every rate of a config as {rate, interval}, the first the one in 'rate' and 'interval'
-- (also .rate and .interval); with the most permits one request may take (the smallest
-- rate's), and how long a grant counts. Kept in RATES by the fields as stored ('rates' or
-- 'interval', then 'rate'), so the limiters of one rate share one table, never written after
-- it is made. (Loaded as a function library, RATES lives from one call to the next: a cache
-- of a pure parse, bounded, emptied when full.) nil when the fields are not numbers.
local RATES, RATES_KEPT, RATES_MAX = {}, 0, 256

-- One rate: `rate` permits per `interval` us, and interval = q * rate + rem worked out once
-- (the token bucket's refill of one permit takes q us and rem/rate of one, token_bucket.lua).
local function new_rate(rate, interval)
  local q = floor(interval / rate)
  if q * rate > interval then
    q = q - 1 -- (a quotient the division rounded up)
  end
  return { rate = rate, interval = interval, q = q, rem = interval - q * rate }
end

-- `margin`: the fleet's measured margin (the field 'margin', margin.lua), which widens every
-- interval (nil: none).
local function config_rates(stored, rate, interval, margin)
  local first = stored or interval
  if margin then
    first = first .. '+' .. margin
  end
  local kept = RATES[first]
  if kept and kept[rate] then
    return kept[rate]
  end
  local widen = tonumber(margin or '0') or 0
  local rates = { rate = tonumber(rate), interval = tonumber(interval) }
  if not (rates.rate and rates.interval) then
    return nil
  end
  rates.interval = rates.interval + widen
  rates.max_permits, rates.longest = rates.rate, rates.interval
  if stored then
    for p, i in string.gmatch(stored, '(%d+):(%d+)') do
      p, i = tonumber(p), tonumber(i) + widen
      rates[#rates + 1] = new_rate(p, i)
      rates.max_permits, rates.longest = min(rates.max_permits, p), max(rates.longest, i)
    end
  else
    rates[1] = new_rate(rates.rate, rates.interval)
  end
  if #rates == 0 then
    return nil
  end
  if RATES_KEPT >= RATES_MAX then
    RATES, RATES_KEPT, kept = {}, 0, nil
  end
  if not kept then
    kept = {}
    RATES[first] = kept
  end
  kept[rate] = rates
  RATES_KEPT = RATES_KEPT + 1
  return rates
end

-- Where the state of a budget lives: in the config hash (an OVERALL budget of an algorithm
-- whose table says `in_hash`), or in value keys.
local function state_in_hash(rate_type, algorithm)
  local algorithm_table = ALGORITHMS[algorithm]
  return rate_type == 'OVERALL' and algorithm_table ~= nil and algorithm_table.in_hash
end

-- Reads the config hash; returns nil when the limiter has no config. One HGETALL straight into
-- one table (every field named in its constructor, so it is allocated once): the fields a
-- config lacks keep their defaults.
local function load_config(config_key)
  local c = redis.call('HGETALL', config_key)
  if #c == 0 then
    return nil
  elseif #c > 2 * CONFIG_FIELDS then -- (bounds the loop below: a config has fewer)
    error('aiolimit: the config of ' .. config_key .. ' is not an aiolimit config; delete() the limiter')
  end
  -- The fields a config rarely has are not named (nil: none), so that the table is no bigger
  -- than most configs need: 'epochs' (token_bucket.lua), 'expires_at' (set by expire(): when
  -- the whole limiter disappears; no state may outlive it), 'clock' (the latest
  -- client-supplied time this limiter has acted on, clock='client' only) and
  -- 'blocked_until' (set by block(): no grant starts before it), 'margin' and 'margin_at'
  -- (margin.lua: the fleet's measured margin, by which every interval is read widened).
  local config = {
    key = config_key, rate = false, interval = false, type = false, keep_alive = 0,
    clock_moved = false, gen = '-', life = '-', algorithm = DEFAULT_ALGORITHM, rates = false, spacing = 0,
    -- an OVERALL token bucket's or fixed windows' state (see load_group), as stored
    state = false,
    in_hash = false, max_permits = false, longest = false, lane = false,
  }
  for i = 1, #c, 2 do
    config[c[i]] = c[i + 1]
  end
  -- (what is not a field of the hash, whatever fields a foreign hand wrote there)
  config.key, config.clock_moved = config_key, false
  -- The life of the state (a grant's member names it): the generation, without the rates
  -- epoch a PER_CLIENT token bucket adds with its 'epochs' (token_bucket.lua), which keeps
  -- the state.
  config.life = config.epochs and match(config.gen, '^[^.]*') or config.gen
  local rates = config.rate and config.interval
    and config_rates(config.rates or nil, config.rate, config.interval, config.margin)
  if rates then
    config.rate, config.interval, config.rates = rates.rate, rates.interval, rates
    config.max_permits, config.longest = rates.max_permits, rates.longest
  end
  -- (the fields below are rarely there: only what came from the hash is a string to convert)
  if config.keep_alive ~= 0 then
    config.keep_alive = tonumber(config.keep_alive)
  end
  if config.spacing ~= 0 then
    config.spacing = tonumber(config.spacing)
  end
  if config.expires_at then
    config.expires_at = tonumber(config.expires_at)
  end
  if config.clock then
    config.clock = tonumber(config.clock)
  end
  if config.blocked_until then
    config.blocked_until = tonumber(config.blocked_until)
  end
  if not (rates and config.keep_alive and config.type and config.spacing and ALGORITHMS[config.algorithm]) then
    error('aiolimit: the config of ' .. config_key .. ' is not an aiolimit config; delete() the limiter')
  end
  config.in_hash = state_in_hash(config.type, config.algorithm)
  -- One rate and no spacing, where the algorithm has a `grant_now`: see `acquire` (batch.lua).
  config.lane = #rates == 1 and config.spacing == 0 and ALGORITHMS[config.algorithm].grant_now ~= nil
  return config
end

-- The config a budget script acts on, or nil and the reply that says why there is none:
-- {-1} without config, {-3, type} when the caller built the keys for the other rate type.
local function budget_config(config_key, rate_type)
  local config = load_config(config_key)
  if not config then
    return nil, { -1 }
  end
  if config.type ~= rate_type then
    return nil, { -3, config.type }
  end
  return config
end

local function save_clock(config)
  if config.clock_moved then
    redis.call('HSET', config.key, 'clock', fmt(config.clock))
    config.clock_moved = false
  end
end

-- Gives the clients registry a TTL of at least `ttl` ms (each client's state outlives its
-- grants by one interval; the registry outlives every client's state), never past the end
-- expire() set.
local function extend_registry(registry_key, ttl, config, now)
  if config.expires_at then
    ttl = min(ttl, max(ms(config.expires_at - now), 1))
  end
  local current = redis.call('PTTL', registry_key)
  if current < ttl then -- (-1: no TTL, -2: no key)
    redis.call('PEXPIRE', registry_key, ttl)
  end
end

-- Rate i's key of a budget key ("<tag>:value:<client>" -> "<tag>:value2:<client>").
local function rate_key(config, key, base, i)
  local tag_length = #config.key - #':config'
  return string.sub(key, 1, tag_length) .. ':' .. base .. i .. string.sub(key, tag_length + #base + 2)
end


-- Every key a budget's rates may use (for removing them whatever the config was).
local function all_rate_keys(config_key, value_key, permits_key)
  local keys = { value_key, permits_key }
  local config = { key = config_key }
  for i = 2, MAX_RATES do
    table.insert(keys, rate_key(config, value_key, 'value', i))
    table.insert(keys, rate_key(config, permits_key, 'permits', i))
  end
  return keys
end
