-- Shared functions, prepended to every operation script when it is loaded.
--
-- State of one budget (the whole limiter for OVERALL, one client for PER_CLIENT):
--   value key    string "<gen> <used> <seq> <cursor>": the config generation the state
--                belongs to, the permits its log holds (granted in the window, reservations
--                included), the sequence number of its last grant, and the walk cursor
--                ("<score> <prefix> <group>", or "-" for none; see `wait_for`).
--   permits key  ZSET: one member "<permits>:<seq>" per grant, scored by its start time.
-- Both keys carry the same TTL, which outlives the newest grant by one interval: an idle
-- budget simply disappears. A grant may be scored in the future: a reservation made for a
-- caller that waits (see `acquire` below); it counts like any other grant.
-- Times are integer microseconds; window_start = now - interval, and a grant scored at or
-- before window_start has expired.
--
-- Nothing here may run long, however big the state: every loop over the log is bounded
-- (WALK_STEPS, RECLAIM_STEPS), and where a bound cuts a loop short the answer errs on the
-- safe side (a later slot, fewer permits), never towards granting more than the rate.
--
-- A config's generation ("gen") is written by set_rate when it starts every budget afresh
-- (a new config, a rate type change, no keep_state). State of another generation belongs to
-- no limiter: it is never counted, and is dropped when touched. So resetting or deleting a
-- limiter with 100 000 clients is O(1); their keys are removed afterwards in small chunks.
-- An OVERALL token bucket or fixed window keeps its state in the config hash itself (field
-- 'state', see "groups" below): it goes with the config, so its config has no generation.
--
-- The reply codes, the formats and the bounds here are the protocol the Python twin follows
-- too: aiolimit/backends/_protocol.py states them again, and tests/test_protocol.py checks
-- that the two agree.

local unpack = unpack or table.unpack

local MAX_EXACT = 9007199254740991 -- 2^53 - 1: Lua numbers are doubles
local WALK_STEPS = 1000 -- log entries one wait computation may read
local RECLAIM_STEPS = 1000 -- expired log entries one call may remove from a budget
local MAX_RATES = 8 -- rates one limiter applies at once

local server_now -- read once per script call

-- The algorithms a config may name (README, "Algorithms").
local ALGORITHMS = { SLIDING_WINDOW = true, TOKEN_BUCKET = true, FIXED_WINDOW = true }

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

local function fmt(n)
  return string.format('%d', n)
end

local function ms(us)
  return math.ceil(us / 1000)
end

local function member_permits(member)
  return tonumber(string.match(member, '^(%d+):'))
end

local function member_id(member)
  return string.match(member, '^%d+:(.*)$')
end

-- The text of an error raised by redis.call or error(), without the script position.
local function error_text(e)
  if type(e) == 'table' then
    e = e.err or 'error'
  end
  e = string.gsub(tostring(e), '%s+', ' ')
  return string.match(e, 'aiolimit: (.*)$') or e
end

-- Reads the config hash; returns nil when the limiter has no config.
local function load_config(config_key)
  local c = redis.call('HMGET', config_key, 'rate', 'interval', 'type', 'keep_alive', 'expires_at', 'clock', 'gen',
    'algorithm', 'rates', 'spacing', 'blocked_until', 'state')
  if not c[1] then
    return nil
  end
  local config = {
    key = config_key,
    rate = tonumber(c[1]),
    interval = tonumber(c[2]),
    type = c[3],
    keep_alive = tonumber(c[4] or '0'),
    -- set by expire(): when the whole limiter disappears; no state may outlive it
    expires_at = c[5] and tonumber(c[5]),
    -- the latest client-supplied time this limiter has acted on (clock='client' only)
    clock = c[6] and tonumber(c[6]),
    gen = c[7] or '-',
    algorithm = c[8] or 'SLIDING_WINDOW',
    spacing = tonumber(c[10] or '0'),
    -- set by block(): no grant starts before it
    blocked_until = c[11] and tonumber(c[11]),
    -- an OVERALL token bucket's or fixed windows' state (see load_group), as stored
    state = c[12],
  }
  if not (config.rate and config.interval and config.keep_alive and config.type and config.spacing
        and ALGORITHMS[config.algorithm]) then
    error('aiolimit: the config of ' .. config_key .. ' is not an aiolimit config; delete() the limiter')
  end
  -- Every rate as {rate, interval}; the first is the one in 'rate' and 'interval'.
  config.rates = { { rate = config.rate, interval = config.interval } }
  if c[9] then
    config.rates = {}
    for p, i in string.gmatch(c[9], '(%d+):(%d+)') do
      table.insert(config.rates, { rate = tonumber(p), interval = tonumber(i) })
    end
  end
  -- Where the state of its budget lives: in the config hash (OVERALL counters), or in value keys.
  config.in_hash = config.type == 'OVERALL' and config.algorithm ~= 'SLIDING_WINDOW'
  -- The most permits one request may take (the smallest rate's), and how long a grant counts.
  config.max_permits, config.longest = config.rate, config.interval
  for _, r in ipairs(config.rates) do
    config.max_permits = math.min(config.max_permits, r.rate)
    config.longest = math.max(config.longest, r.interval)
  end
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

-- -- budgets ---------------------------------------------------------------------------------

-- Reads a budget. State of another generation (or a log without its value key) belongs to
-- no limiter: with `write` it is dropped, without it is simply not counted.
local function load_budget(value_key, permits_key, config, write)
  local budget = { value_key = value_key, permits_key = permits_key, used = 0, seq = 0 }
  local raw = redis.call('GET', value_key)
  if raw then
    local gen, used, seq, cursor = string.match(raw, '^(%S+) (%-?%d+) (%d+) (.*)$')
    if not gen then
      error('aiolimit: the state in ' .. value_key .. ' is not aiolimit state; delete() the limiter')
    end
    if gen == config.gen then
      budget.used, budget.seq = tonumber(used), tonumber(seq)
      local cs, cp, cg = string.match(cursor, '^(%-?%d+) (%-?%d+) (%-?%d+)$')
      if cs then
        budget.cs, budget.cp, budget.cg = tonumber(cs), tonumber(cp), tonumber(cg)
      end
      return budget
    end
  end
  if write then
    redis.call('UNLINK', permits_key)
    if raw then
      redis.call('DEL', value_key)
    end
  end
  budget.fresh = true
  return budget
end

local function encode_budget(budget, gen)
  local cursor = budget.cs and (fmt(budget.cs) .. ' ' .. fmt(budget.cp) .. ' ' .. fmt(budget.cg)) or '-'
  return gen .. ' ' .. fmt(budget.used) .. ' ' .. fmt(budget.seq) .. ' ' .. cursor
end

-- Keeps the cursor right when `permits` are added (or, negative, removed) at `score`.
local function cursor_moved(budget, score, permits)
  if budget.cs and score <= budget.cs then
    budget.cp = budget.cp + permits
    if score == budget.cs then
      budget.cg = budget.cg + permits
    end
  end
end

-- Removes grants that have left the window from the log and from `used`: at most
-- RECLAIM_STEPS of them per call (any left over still count, which never over-admits, and
-- go in the next calls). Without `write` nothing is written and `used` is the only change.
local function reclaim(budget, window_start, write)
  if budget.fresh then
    return
  end
  local key = budget.permits_key
  local expired = redis.call('ZRANGEBYSCORE', key, '-inf', fmt(window_start), 'WITHSCORES', 'LIMIT', 0, RECLAIM_STEPS)
  if #expired == 0 then
    return
  end
  if #expired == 2 * RECLAIM_STEPS then
    -- Many expired: if the whole log has, drop it at once (UNLINK frees it off the main thread).
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if tonumber(newest[2]) <= window_start then
      budget.used, budget.cs = 0, nil
      if write then
        budget.seq = 0
        budget.dirty = true
        redis.call('UNLINK', key)
      end
      return
    end
  end
  local sum = 0
  for i = 1, #expired, 2 do
    sum = sum + member_permits(expired[i])
  end
  budget.used = budget.used - sum
  if write then
    budget.dirty = true
    redis.call('ZREMRANGEBYRANK', key, 0, #expired / 2 - 1)
    local last = tonumber(expired[#expired])
    if budget.cs and budget.cs <= last then
      budget.cs = nil
    elseif budget.cs then
      budget.cp = budget.cp - sum
    end
    if budget.used == 0 then
      budget.seq = 0 -- an empty log starts over, as a budget whose keys expired does
    end
  end
end

-- Writes a budget back and gives both keys a TTL that outlives its newest grant (a
-- reservation may lie in the future), but not the limiter itself when expire() gave it an
-- end. With no grant left the budget is simply gone. Returns the TTL in ms (0: gone).
local function save_budget(budget, config, now)
  local newest = redis.call('ZRANGE', budget.permits_key, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    redis.call('DEL', budget.value_key)
    return 0
  end
  local ttl = math.max(ms(tonumber(newest[2]) + (budget.interval or config.interval) - now), 1)
  if config.expires_at then
    ttl = math.max(math.min(ttl, ms(config.expires_at - now)), 1)
  end
  redis.call('SET', budget.value_key, encode_budget(budget, config.gen), 'PX', ttl)
  redis.call('PEXPIRE', budget.permits_key, ttl)
  return ttl
end

-- Gives the clients registry a TTL of at least `ttl` ms (each client's state outlives its
-- grants by one interval; the registry outlives every client's state), never past the end
-- expire() set.
local function extend_registry(registry_key, ttl, config, now)
  if config.expires_at then
    ttl = math.min(ttl, math.max(ms(config.expires_at - now), 1))
  end
  local current = redis.call('PTTL', registry_key)
  if current < ttl then -- (-1: no TTL, -2: no key)
    redis.call('PEXPIRE', registry_key, ttl)
  end
end

-- -- waiting ---------------------------------------------------------------------------------
--
-- A request for `permits` when only `left` are free waits until `need = permits - left` of
-- the logged permits have expired: the log is summed oldest first until it holds `need`,
-- and the wait ends when that grant expires. Summing from the oldest grant every time would
-- cost O(queue depth) per waiter, so the budget keeps a cursor: a score `cs`, the permits
-- `cp` logged at or before it, and the permits `cg` logged exactly at it. Each walk starts
-- at the cursor (forwards when need > cp, else backwards) and leaves it where it stopped, so
-- a queue of waiters served in order moves it a few entries each: O(1) per waiter however
-- deep the queue. A walk reads at most WALK_STEPS entries; if it has not arrived by then it
-- assumes one permit per entry still to come, which reaches `need` no earlier than the exact
-- answer: a later slot, never an earlier one.

local function walk_forward(budget, need)
  local key = budget.permits_key
  local rank, prefix = 0, 0
  if budget.cs then
    rank = redis.call('ZCOUNT', key, '-inf', fmt(budget.cs))
    prefix = budget.cp
  end
  local found, group_score, group = nil, nil, 0
  local steps, size = 0, 16
  while steps < WALK_STEPS do
    local entries = redis.call('ZRANGE', key, rank, rank + size - 1, 'WITHSCORES')
    for i = 1, #entries, 2 do
      local score = tonumber(entries[i + 1])
      if found and score ~= found then
        budget.cs, budget.cp, budget.cg = found, prefix, group
        return found
      end
      local permits = member_permits(entries[i])
      if score == group_score then
        group = group + permits
      else
        group_score, group = score, permits
      end
      prefix = prefix + permits
      rank, steps = rank + 1, steps + 1
      if not found and prefix >= need then
        found = score
      end
    end
    if #entries < 2 * size then -- the end of the log
      if found then
        budget.cs, budget.cp, budget.cg = found, prefix, group
      end
      return found
    end
    size = math.min(size * 4, WALK_STEPS - steps + 1)
  end
  if found then
    return found
  end
  -- Out of steps: with at least one permit per entry, `need` is reached at most this far on.
  local at = math.min(rank - 1 + need - prefix, redis.call('ZCARD', key) - 1)
  local entry = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
  return tonumber(entry[2])
end

local function walk_back(budget, need)
  -- The cursor's group holds `need`; find the oldest group that still does.
  local answer = budget.cs
  local below = budget.cp - budget.cg -- permits logged before the answer's group
  if below < need then
    return answer
  end
  local key = budget.permits_key
  local group_score, group, offset, steps, size = nil, 0, 0, 0, 16
  while steps < WALK_STEPS do
    local entries = redis.call('ZREVRANGEBYSCORE', key, '(' .. fmt(budget.cs), '-inf', 'WITHSCORES', 'LIMIT', offset, size)
    for i = 1, #entries, 2 do
      local score = tonumber(entries[i + 1])
      if group_score and score ~= group_score then
        -- group_score's group is complete and holds `need` (its prefix is `below`)
        answer = group_score
        budget.cs, budget.cp, budget.cg = group_score, below, group
        below = below - group
        if below < need then
          return answer
        end
        group = 0
      end
      group_score = score
      group = group + member_permits(entries[i])
      steps = steps + 1
    end
    if #entries < 2 * size then -- the start of the log: the last group read is the oldest
      if group_score then
        budget.cs, budget.cp, budget.cg = group_score, below, group
        return group_score
      end
      return answer
    end
    offset = offset + size
    size = math.min(size * 4, WALK_STEPS - steps + 1)
  end
  -- Out of steps: the group being read holds `need` too, but it may not be the oldest.
  return group_score or answer
end

-- Microseconds from `now` until `need` more permits have left the window.
local function wait_for(budget, need, interval, now)
  local at
  if budget.cs and budget.cp >= need then
    at = walk_back(budget, need)
  else
    at = walk_forward(budget, need)
  end
  if not at then
    return interval -- the log holds fewer permits than `used` says: it was tampered with
  end
  return math.max(at + interval - now, 1)
end

-- -- groups: every rate of one budget, by algorithm --------------------------------------------
--
-- A budget (the whole limiter for OVERALL, one client for PER_CLIENT) applies every rate of
-- its config at once. How it keeps them depends on the algorithm:
--   SLIDING_WINDOW  a log per rate, as above: the first rate's in the budget's value key and
--                   permits ZSET, rate i's (i > 1) in "<tag>:value<i>..." and
--                   "<tag>:permits<i>..." (the same names with the rate's number after
--                   "value"/"permits"; same hash tag, so the same slot).
--   TOKEN_BUCKET    the value key "<gen> <last> <tat 1> <frac 1> ... <tat n> <frac n>": per
--                   rate, the time at which its bucket is full again (GCRA's theoretical
--                   arrival time), exactly: tat + frac/rate microseconds; a bucket of `rate`
--                   tokens refills one token per interval/rate.
--   FIXED_WINDOW    the value key "<gen> <last> <end 1> <count 1> ... <end n> <count n>":
--                   per rate, the end of the latest window holding grants (windows are
--                   aligned to multiples of the interval since the Unix epoch; its end says
--                   which it is under any interval, so a new interval keeps its count), and
--                   how many permits it holds.
-- <last> is the start of the latest grant ("-": none), for the spacing and for FIFO.
-- An OVERALL token bucket or fixed window keeps the same numbers, without the generation, in
-- its config hash: field 'state', "<last> <tat 1> <frac 1> ..." or "<last> <end 1> <count 1>
-- ...". One key instead of two halves the memory of such a limiter and saves a GET per call.
-- The field has no TTL of its own: it goes with the config (delete, set_rate without
-- keep_state, expire, keep_alive), and state that has run out is harmless until the next
-- write drops it: a bucket whose full time has passed is full, a window that has ended holds
-- nothing, whatever the rates.
-- Each rate tells the earliest start at which it allows a request; every rate allows it
-- from then on (given that a start is never before the latest one), so the request starts at
-- the latest of them, no earlier than the latest grant, nor than it plus the spacing.

-- Rate i's key of a budget key ("<tag>:value:<client>" -> "<tag>:value2:<client>").
local function rate_key(config, key, base, i)
  local tag_length = #config.key - #':config'
  return string.sub(key, 1, tag_length) .. ':' .. base .. i .. string.sub(key, tag_length + #base + 2)
end

-- Removes a token bucket's or fixed windows' state.
local function drop_counters(group)
  local config = group.config
  if not config.in_hash then
    redis.call('DEL', group.value_key)
  elseif config.state then
    redis.call('HDEL', config.key, 'state')
    config.state = nil
  end
end

local function load_group(config, value_key, permits_key, write)
  local group = { config = config, value_key = value_key, permits_key = permits_key, fresh = true }
  if config.algorithm == 'SLIDING_WINDOW' then
    group.budgets = {}
    for i, r in ipairs(config.rates) do
      local budget
      if i == 1 then
        budget = load_budget(value_key, permits_key, config, write)
      else
        budget = load_budget(rate_key(config, value_key, 'value', i), rate_key(config, permits_key, 'permits', i), config, write)
      end
      budget.rate, budget.interval = r.rate, r.interval
      group.budgets[i] = budget
      group.fresh = group.fresh and budget.fresh
    end
    return group
  end
  local per = 2
  group.n = {}
  -- at: where <last> stands (after the generation in a value key)
  local raw, at = config.state, 1
  if not config.in_hash then
    raw, at = redis.call('GET', value_key), 2
  end
  if raw then
    local fields = {}
    for field in string.gmatch(raw, '%S+') do
      table.insert(fields, field)
    end
    if (at == 1 or fields[1] == config.gen) and #fields >= at and (#fields - at) % 2 == 0 then
      -- (set_rate with keep_state may have changed the rates: each keeps its own state by
      -- position, a rate added starts afresh)
      group.fresh = nil
      group.last = tonumber(fields[at])
      for i = 1, per * #config.rates do
        group.n[i] = tonumber(fields[i + at] or '0')
      end
      if config.algorithm == 'TOKEN_BUCKET' then
        for i, r in ipairs(config.rates) do
          if group.n[2 * i] >= r.rate then -- a remainder of another rate: a whole us, rounded up
            group.n[2 * i - 1], group.n[2 * i] = group.n[2 * i - 1] + 1, 0
          end
        end
      end
      return group
    end
    if write then
      drop_counters(group) -- another generation's, or another config's
    end
  end
  for i = 1, per * #config.rates do
    group.n[i] = 0 -- a full bucket; no window yet
  end
  return group
end

-- The number of rate r's latest window holding grants (from its end; -1: none yet).
local function window_of(group, i, r)
  return math.floor((group.n[2 * i - 1] - 1) / r.interval)
end

-- Reclaims every log of a sliding window's group (the counters have none).
local function reclaim_group(group, now, write)
  if group.budgets then
    for _, budget in ipairs(group.budgets) do
      reclaim(budget, now - budget.interval, write)
    end
  end
end

-- The refill that n tokens of rate r cost, n * interval / rate microseconds, exactly: whole
-- microseconds and the rest in 1/rate of a microsecond. (Past 2^53 a product is not exact
-- in a double: the cost is then rounded up to whole microseconds, never down.)
local function cost(r, n)
  local q = math.floor(r.interval / r.rate)
  local rest = n * (r.interval - q * r.rate)
  if rest >= MAX_EXACT then
    return n * q + math.ceil(rest / r.rate), 0
  end
  local whole = math.floor(rest / r.rate)
  return n * q + whole, rest - whole * r.rate
end

-- A bucket's full time (us, frac) moved on by n tokens, from no earlier than `from`.
local function refilled(r, us, frac, from, n)
  if us < from or (us == from and frac == 0) then
    us, frac = from, 0
  end
  local whole, rest = cost(r, n)
  frac = frac + rest
  if frac >= r.rate then
    us, frac = us + 1, frac - r.rate
  end
  return us + whole, frac
end

-- The newest grant's start in a sliding window (nil: none logged).
local function newest_start(group)
  local last
  for _, budget in ipairs(group.budgets) do
    if not budget.fresh then
      local newest = redis.call('ZRANGE', budget.permits_key, -1, -1, 'WITHSCORES')
      if #newest > 0 then
        last = math.max(last or tonumber(newest[2]), tonumber(newest[2]))
      end
    end
  end
  return last
end

-- Permits a request could take at `now` (negative while reservations are queued).
local function group_left(group, now)
  local config, left = group.config, nil
  local function least(x)
    left = left and math.min(left, x) or x
  end
  if group.budgets then
    for _, budget in ipairs(group.budgets) do
      least(budget.rate - budget.used)
    end
  elseif config.algorithm == 'TOKEN_BUCKET' then
    for i, r in ipairs(config.rates) do
      local tat, frac = group.n[2 * i - 1], group.n[2 * i]
      if tat < now or (tat == now and frac == 0) then
        least(r.rate)
      else
        least(math.floor(((r.interval - (tat - now)) * r.rate - frac) / r.interval))
      end
    end
  else
    for i, r in ipairs(config.rates) do
      local window, count = window_of(group, i, r), group.n[2 * i]
      local current = math.floor(now / r.interval)
      least(window < current and r.rate or (window == current and r.rate - count or 0))
    end
  end
  return left
end

-- The earliest start (>= now) at which every rate and the spacing allow `permits`; nil when
-- a log would hold more than MAX_EXACT. `logged` (sliding window, read-only callers): each
-- budget's `used` before a reclaim that was not written, which the walk needs.
local function earliest(group, permits, now, logged)
  local config, start = group.config, now
  if group.budgets then
    for i, budget in ipairs(group.budgets) do
      if budget.used + permits > MAX_EXACT then
        return nil
      end
      local left = budget.rate - budget.used
      if left < permits and not budget.fresh then
        local before = logged and logged[i] or budget.used
        start = math.max(start, now + wait_for(budget, permits - (budget.rate - before), budget.interval, now))
      end
    end
    if #group.budgets > 1 or config.spacing > 0 then
      group.last = newest_start(group)
    end
  elseif config.algorithm == 'TOKEN_BUCKET' then
    for i, r in ipairs(config.rates) do
      local tat, frac = refilled(r, group.n[2 * i - 1], group.n[2 * i], now, permits)
      start = math.max(start, tat - r.interval + (frac > 0 and 1 or 0))
    end
  else
    for i, r in ipairs(config.rates) do
      local window, count = window_of(group, i, r), group.n[2 * i]
      if window >= math.floor(now / r.interval) then
        if count + permits <= r.rate then
          start = math.max(start, window * r.interval)
        else
          start = math.max(start, (window + 1) * r.interval)
        end
      end
    end
  end
  if group.last then
    start = math.max(start, group.last + config.spacing)
  end
  if config.blocked_until then
    start = math.max(start, config.blocked_until)
  end
  return start
end

-- Takes `permits` at `start` (from `earliest`) in every rate; returns the grant's member.
local function commit(group, permits, start)
  local config = group.config
  group.fresh = nil
  group.last = math.max(group.last or start, start)
  if group.budgets then
    local seq = 0
    for _, budget in ipairs(group.budgets) do
      seq = math.max(seq, budget.seq)
    end
    seq = seq + 1
    local member = fmt(permits) .. ':' .. fmt(seq)
    for _, budget in ipairs(group.budgets) do
      redis.call('ZADD', budget.permits_key, fmt(start), member)
      budget.seq, budget.fresh = seq, nil
      budget.used = budget.used + permits
      cursor_moved(budget, start, permits)
      budget.latest = math.max(budget.latest or start, start)
    end
    return member
  end
  if config.algorithm == 'TOKEN_BUCKET' then
    for i, r in ipairs(config.rates) do
      group.n[2 * i - 1], group.n[2 * i] = refilled(r, group.n[2 * i - 1], group.n[2 * i], start, permits)
    end
  else
    for i, r in ipairs(config.rates) do
      local window = math.floor(start / r.interval)
      if window == window_of(group, i, r) then
        group.n[2 * i] = group.n[2 * i] + permits
      else
        group.n[2 * i] = permits
      end
      group.n[2 * i - 1] = (window + 1) * r.interval
    end
  end
  group.dirty = true
  return fmt(permits) .. ':' .. fmt(start) -- a counter grant's member: its permits and start
end

-- Writes a group back and gives its keys their TTLs; returns the longest TTL in ms (0: gone).
local function save_group(group, now)
  local config = group.config
  if group.budgets then
    local longest = 0
    for _, budget in ipairs(group.budgets) do
      if budget.latest or budget.dirty then
        longest = math.max(longest, save_budget(budget, config, now))
      end
    end
    return longest
  end
  -- The state matters until every bucket is full again / every window has ended, and the
  -- spacing has passed.
  local until_ = group.last and (group.last + config.spacing) or 0
  for i, r in ipairs(config.rates) do
    if config.algorithm == 'TOKEN_BUCKET' then
      until_ = math.max(until_, group.n[2 * i - 1] + (group.n[2 * i] > 0 and 1 or 0))
    else
      until_ = math.max(until_, (window_of(group, i, r) + 1) * r.interval)
    end
  end
  if until_ <= now then
    drop_counters(group)
    return 0
  end
  local ttl = ms(until_ - now)
  if config.expires_at then
    ttl = math.max(math.min(ttl, ms(config.expires_at - now)), 1)
  end
  -- The latest start is kept only where a later request needs it: with several rates (for
  -- FIFO) or a spacing; one rate keeps its requests in order by itself. (A short value is
  -- stored by Redis in one allocation.)
  local keep_last = group.last and (#config.rates > 1 or config.spacing > 0)
  local fields = { keep_last and fmt(group.last) or '-' }
  for _, n in ipairs(group.n) do
    table.insert(fields, fmt(n))
  end
  if config.in_hash then
    -- No TTL of its own: the state goes with the config (see "groups" above).
    config.state = table.concat(fields, ' ')
    redis.call('HSET', config.key, 'state', config.state)
  else
    redis.call('SET', group.value_key, config.gen .. ' ' .. table.concat(fields, ' '), 'PX', ttl)
  end
  return ttl
end

-- Hands back `wanted` permits (or exactly the grant `member`); returns how many went back.
local function release_group(group, wanted, member, now)
  local config, released = group.config, 0
  if group.budgets then
    for _, budget in ipairs(group.budgets) do
      local key, count = budget.permits_key, 0
      local function take(m, score, permits)
        redis.call('ZREM', key, m)
        cursor_moved(budget, score, -permits)
        count = count + permits
      end
      if member ~= '' then
        local score = redis.call('ZSCORE', key, member)
        if score then
          take(member, tonumber(score), member_permits(member))
        end
      else
        -- Reservations (grants starting in the future) belong to waiting callers.
        local entries = redis.call('ZREVRANGEBYSCORE', key, fmt(now), '-inf', 'WITHSCORES', 'LIMIT', 0, WALK_STEPS)
        for i = 1, #entries, 2 do
          if count >= wanted then
            break
          end
          local m, score = entries[i], tonumber(entries[i + 1])
          local permits = member_permits(m)
          local rest = permits - math.min(permits, wanted - count)
          take(m, score, permits - rest)
          if rest > 0 then
            redis.call('ZADD', key, fmt(score), fmt(rest) .. ':' .. member_id(m))
          end
        end
      end
      if count > 0 then
        budget.used = budget.used - count
        budget.dirty = true
      end
      released = math.max(released, count)
    end
    return released
  end
  local start = member ~= '' and tonumber(string.match(member, ':(%-?%d+)$'))
  if member ~= '' then
    wanted = member_permits(member)
  end
  for i, r in ipairs(config.rates) do
    local count = 0
    if config.algorithm == 'TOKEN_BUCKET' then
      -- Tokens go back, never above a full bucket.
      local tat, frac = group.n[2 * i - 1], group.n[2 * i]
      if tat > now or (tat == now and frac > 0) then
        count = math.min(wanted, math.ceil(((tat - now) * r.rate + frac) / r.interval))
        local whole, rest = cost(r, wanted)
        tat, frac = tat - whole, frac - rest
        if frac < 0 then
          tat, frac = tat - 1, frac + r.rate
        end
        if tat < now then
          tat, frac = now, 0
        end
        group.n[2 * i - 1], group.n[2 * i] = tat, frac
      end
    else
      local window = window_of(group, i, r)
      -- Only the latest window's count is kept: a grant there (or, without a member, in the
      -- current window when nothing is reserved ahead) can go back.
      if (start and math.floor(start / r.interval) == window) or (not start and window == math.floor(now / r.interval)) then
        count = math.min(wanted, group.n[2 * i])
        group.n[2 * i] = group.n[2 * i] - count
      end
    end
    released = math.max(released, count)
  end
  if released > 0 then
    group.dirty = true
  end
  return released
end

-- -- acquiring -------------------------------------------------------------------------------
--
-- acquire.lua runs one request, acquire_many.lua several (requests that arrived together); a
-- batch reads each limiter's config, the clock and each budget once, decides its requests in
-- order exactly as separate calls would, and writes each budget once. A request fails on its
-- own: everything that can fail is read before its grant is logged, and a failure is its
-- caller's reply alone, so no other request of the batch is lost or miscounted.
--
-- A request is "<permits> <now in us, or - for the server's TIME> <max wait in us, -1 for no
-- limit> <rate type> [<client id>]", where the rate type is the one the caller built the keys
-- for. When the permits are not free now but will be within max wait, they are reserved: the
-- grant is logged at the future time they become free, and the caller sleeps until then, so
-- waiters are served in the order they asked, across every process, in one round trip each.
-- The reply to a request is one string (the codes are _protocol.Reply):
--   "0 <left> <start> <delay> <member> [<blocked until>]"
--                                         granted at `start` (us), `delay` us from now
--                                         (0: now; > 0: a reservation); the end of the
--                                         limiter's latest block() when it has one
--   "1 <wait> <left> <now>"               refused; wait = us until `permits` are free
--   "-1"                                  no config
--   "-2 <rate>"                           permits exceed the (smallest) rate
--   "-3 <type>"                           the keys were built for the other rate type
--   "-4"                                  queue full: more than 2^53 permits would be logged
--   "-5 <message>"                        the request failed (e.g. a key holds foreign data)

-- Writes back a group that granted or changed (its logs are written as they go); once.
local function close_group(group)
  if group.closed or not (group.latest or group.dirty or group.budgets) then
    return
  end
  group.closed = true
  local config, now = group.config, group.now
  local ttl = save_group(group, now)
  if not group.latest then
    return
  end
  if group.client_id then
    -- Scored by the client's latest grant, which an earlier reservation may lie beyond.
    local score = redis.call('ZSCORE', group.registry_key, group.client_id)
    if not score or tonumber(score) < group.latest then
      redis.call('ZADD', group.registry_key, fmt(group.latest), group.client_id)
    end
    redis.call('ZREMRANGEBYSCORE', group.registry_key, '-inf', fmt(now - 2 * config.longest))
    extend_registry(group.registry_key, ttl + ms(config.longest), config, now)
  end
  if config.keep_alive > 0 and not config.expires_at then
    redis.call('PEXPIRE', group.config_key, math.max(ms(config.keep_alive), ttl))
  end
end

local function new_batch()
  return { configs = {}, groups = {}, order = {} }
end

local function open_group(batch, config, now, config_key, value_key, permits_key, registry_key)
  local group = batch.groups[value_key]
  if group and group.now ~= now then
    close_group(group) -- another clock reading: write back and start over, as a new call would
    group = nil
  end
  if group then
    return group
  end
  if config.type == 'PER_CLIENT' then
    -- The registry is written when the batch closes, where nothing may fail any more.
    local kind = redis.call('TYPE', registry_key)
    kind = kind.ok or kind
    if kind ~= 'zset' and kind ~= 'none' then
      error('aiolimit: ' .. registry_key .. ' holds a ' .. kind .. ', not aiolimit state; delete() the limiter')
    end
  end
  group = load_group(config, value_key, permits_key, true)
  reclaim_group(group, now, true)
  group.now = now
  group.config_key, group.registry_key = config_key, registry_key
  batch.groups[value_key] = group
  table.insert(batch.order, group)
  return group
end

local function acquire(batch, config_key, value_key, permits_key, registry_key, request)
  local permits, now_arg, max_wait, rate_type, client_id =
    string.match(request, '^(%d+) (%S+) (%S+) (%S+) ?(.*)$')
  permits = tonumber(permits)
  max_wait = tonumber(max_wait)
  local config = batch.configs[config_key]
  if config == nil then
    config = load_config(config_key) or false
    batch.configs[config_key] = config
  end
  if not config then
    return '-1'
  end
  if config.type ~= rate_type then
    return '-3 ' .. config.type
  end
  if permits > config.max_permits then
    return '-2 ' .. fmt(config.max_permits)
  end

  local now = limiter_now(config, now_arg)
  local group = open_group(batch, config, now, config_key, value_key, permits_key, registry_key)
  local start = earliest(group, permits, now)
  if not start then
    return '-4'
  end
  local delay = start - now
  if delay > 0 and max_wait >= 0 and delay > max_wait then
    return '1 ' .. fmt(delay) .. ' ' .. fmt(group_left(group, now)) .. ' ' .. fmt(now)
  end

  -- Nothing below can fail: the grant, and the state that counts it, are written together.
  local member = commit(group, permits, start)
  group.latest = math.max(group.latest or start, start)
  if config.type == 'PER_CLIENT' then
    group.client_id = client_id
  end
  local reply = '0 ' .. fmt(group_left(group, now)) .. ' ' .. fmt(start) .. ' ' .. fmt(delay) .. ' ' .. member
  if config.blocked_until then
    reply = reply .. ' ' .. fmt(config.blocked_until) -- this limiter has been blocked: see block.lua
  end
  return reply
end

-- Runs one request; a failure becomes its own "-5" reply.
local function try_acquire(batch, config_key, value_key, permits_key, registry_key, request)
  local ok, reply = pcall(acquire, batch, config_key, value_key, permits_key, registry_key, request)
  if ok then
    return reply
  end
  return '-5 ' .. error_text(reply)
end

-- Writes every group a batch granted from, and every clock it moved, once.
local function close_batch(batch)
  for _, group in ipairs(batch.order) do
    close_group(group)
  end
  for _, config in pairs(batch.configs) do
    if config then
      save_clock(config)
    end
  end
end

-- -- many clients ----------------------------------------------------------------------------

-- Gives one budget (every rate) the TTLs the current config gives it (as long as its grants
-- count, not past expire()'s end). Returns the longest TTL in ms, 0 when it has no state (or
-- keeps it in the config hash, whose TTL is its own).
local function refresh_group(value_key, permits_key, config, now)
  if config.in_hash then
    return 0
  end
  local group = load_group(config, value_key, permits_key, true)
  if group.fresh then
    return 0
  end
  if group.budgets then
    local longest = 0
    for _, budget in ipairs(group.budgets) do
      if not budget.fresh then
        longest = math.max(longest, save_budget(budget, config, now))
      end
    end
    return longest
  end
  return save_group(group, now)
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
