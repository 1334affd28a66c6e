-- Shared functions, prepended to every operation script when it is loaded.
--
-- State of one budget (the whole limiter for OVERALL, one client for PER_CLIENT):
--   value key    string: permits left = rate - permits granted inside the window.
--                It may go negative after the rate was lowered with keep_state.
--   permits key  ZSET: one member per grant, scored by grant time in microseconds.
--                Member "<permits>:<id>", where <id> is the grant time, suffixed ".<n>" when
--                that member exists already, so members never collide.
-- Both keys carry the same TTL, which outlives the newest grant by one interval: an idle
-- budget simply disappears. A grant may be scored in the future: a reservation made for a
-- caller that waits (see `acquire` below); it counts like any other grant.
-- Times are integer microseconds; window_start = now - interval, and a grant scored at or
-- before window_start has expired.

local unpack = unpack or table.unpack

local server_now -- read once per script call

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
-- acting at an older time after newer grants were reclaimed would over-admit. With
-- `record`, the caller writes config.clock back (save_clock).
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

-- Reads the config hash; returns nil when the limiter has no config.
local function load_config(config_key)
  local c = redis.call('HMGET', config_key, 'rate', 'interval', 'type', 'keep_alive', 'expires_at', 'clock')
  if not c[1] then
    return nil
  end
  return {
    key = config_key,
    rate = tonumber(c[1]),
    interval = tonumber(c[2]),
    type = c[3],
    keep_alive = tonumber(c[4] or '0'),
    -- set by expire(): when the whole limiter disappears; no state may outlive it
    expires_at = c[5] and tonumber(c[5]),
    -- the latest client-supplied time this limiter has acted on (clock='client' only)
    clock = c[6] and tonumber(c[6]),
  }
end

local function sum_permits(members)
  local total = 0
  for _, m in ipairs(members) do
    total = total + member_permits(m)
  end
  return total
end

-- Returns the permits left in the window ending at `now`. With `write`, expired grants are
-- removed from the log and the value key is updated; without, nothing is written.
local function reclaim(value_key, permits_key, rate, window_start, write)
  local left = redis.call('GET', value_key)
  if not left then
    -- No cached value (first use, or the key was evicted): derive it from the log.
    if write then
      redis.call('ZREMRANGEBYSCORE', permits_key, '-inf', fmt(window_start))
      return rate - sum_permits(redis.call('ZRANGE', permits_key, 0, -1))
    end
    return rate - sum_permits(redis.call('ZRANGEBYSCORE', permits_key, '(' .. fmt(window_start), '+inf'))
  end
  left = tonumber(left)
  local expired = redis.call('ZRANGEBYSCORE', permits_key, '-inf', fmt(window_start))
  if #expired > 0 then
    left = left + sum_permits(expired)
    if write then
      redis.call('ZREMRANGEBYSCORE', permits_key, '-inf', fmt(window_start))
      redis.call('SET', value_key, fmt(left), 'KEEPTTL')
    end
  end
  return left
end

-- Microseconds from `now` until `need` more permits have expired out of the window.
local function wait_for(permits_key, need, interval, now)
  local freed = 0
  local batch = 64
  local start = 0
  while true do
    local entries = redis.call('ZRANGE', permits_key, start, start + batch - 1, 'WITHSCORES')
    if #entries == 0 then
      return interval
    end
    for i = 1, #entries, 2 do
      freed = freed + member_permits(entries[i])
      if freed >= need then
        local wait = tonumber(entries[i + 1]) + interval - now
        if wait < 1 then
          return 1
        end
        return wait
      end
    end
    start = start + batch
    batch = batch * 4
  end
end

-- Adds `member` scored `score`, suffixing ".<n>" until it is new; returns the member added.
-- `memo` (optional) remembers the next suffix to try per member within one script call, so
-- a batch of grants in one microsecond does not probe the same members again and again.
local function add_unique(permits_key, score, member, memo)
  local n = memo and memo[member] or 0
  local candidate = n == 0 and member or member .. '.' .. n
  while redis.call('ZADD', permits_key, 'NX', score, candidate) == 0 do
    n = n + 1
    candidate = member .. '.' .. n
  end
  if memo then
    memo[member] = n + 1
  end
  return candidate
end

-- Adds a grant starting at `start` (which may be in the future) and returns its member.
local function log_grant(permits_key, permits, start, memo)
  return add_unique(permits_key, fmt(start), permits .. ':' .. fmt(start), memo)
end

-- Writes a budget's permits left and gives both keys a TTL that outlives its newest grant
-- (a reservation may lie in the future), but not the limiter itself when expire() gave it an
-- end (`expires_at`). With no grant left the budget is simply gone.
-- Returns the TTL in milliseconds (0 when gone).
local function store(value_key, permits_key, left, interval, now, expires_at)
  local newest = redis.call('ZRANGE', permits_key, -1, -1, 'WITHSCORES')
  if #newest == 0 then
    redis.call('DEL', value_key)
    return 0
  end
  local ttl = ms(tonumber(newest[2]) + interval - now)
  if expires_at then
    ttl = math.max(math.min(ttl, ms(expires_at - now)), 1)
  end
  redis.call('SET', value_key, fmt(left), 'PX', ttl)
  redis.call('PEXPIRE', permits_key, ttl)
  return ttl
end

-- Rebuilds a budget's value from its log for a new rate and interval (keep_state); returns
-- its new TTL in milliseconds (0 when it is gone).
local function recompute(value_key, permits_key, rate, interval, now)
  redis.call('ZREMRANGEBYSCORE', permits_key, '-inf', fmt(now - interval))
  local members = redis.call('ZRANGE', permits_key, 0, -1)
  return store(value_key, permits_key, rate - sum_permits(members), interval, now)
end

-- Checks that `ids` (ARGV from `first` on) names every client in the registry, so that a
-- script rewriting or deleting every client's state was handed all their keys.
local function registry_covered(registry_key, first)
  local given = {}
  for i = first, #ARGV do
    given[ARGV[i]] = true
  end
  for _, id in ipairs(redis.call('ZRANGE', registry_key, 0, -1)) do
    if not given[id] then
      return false
    end
  end
  return true
end

-- Acquire requests. acquire.lua runs one, acquire_many.lua several (requests that arrived
-- together); a batch reads each limiter's config, the clock and each budget once, decides its
-- requests in order exactly as separate calls would, and writes each budget once.
--
-- A request is "<permits> <now in us, or - for the server's TIME> <max wait in us, -1 for no
-- limit> <rate type> [<client id>]", where the rate type is the one the caller built the keys
-- for. When the permits are not free now but will be within max wait, they are reserved: the
-- grant is logged at the future time they become free, and the caller sleeps until then, so
-- waiters are served in the order they asked, across every process, in one round trip each.
-- The reply to a request is one string:
--   "0 <left> <start> <delay> <member>"   granted at `start` (us), `delay` us from now
--                                         (0: now; > 0: a reservation)
--   "1 <wait> <left> <now>"               refused; wait = us until `permits` are free
--   "-1"                                  no config
--   "-2 <rate>"                           permits exceed the rate
--   "-3 <type>"                           the keys were built for the other rate type

-- Writes back a budget that granted (its log is written as it goes); closes it once.
local function close_budget(budget)
  if not budget.latest or budget.closed then
    return
  end
  budget.closed = true
  local config, now = budget.config, budget.now
  local interval = config.interval
  local ttl = store(budget.value_key, budget.permits_key, budget.left, interval, now, config.expires_at)
  if budget.client_id then
    redis.call('ZADD', budget.registry_key, fmt(budget.latest), budget.client_id)
    redis.call('ZREMRANGEBYSCORE', budget.registry_key, '-inf', fmt(now - 2 * interval))
    redis.call('PEXPIRE', budget.registry_key, config.expires_at and ttl or ttl + ms(interval))
  end
  if config.keep_alive > 0 and not config.expires_at then
    redis.call('PEXPIRE', budget.config_key, math.max(ms(config.keep_alive), ttl))
  end
end

local function new_batch()
  return { configs = {}, budgets = {}, order = {} }
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
  if permits > config.rate then
    return '-2 ' .. fmt(config.rate)
  end

  local now = limiter_now(config, now_arg)
  local interval = config.interval
  local budget = batch.budgets[value_key]
  if budget and budget.now ~= now then
    close_budget(budget) -- another clock reading: write back and start over, as a new call would
    budget = nil
  end
  if not budget then
    budget = {
      value_key = value_key,
      permits_key = permits_key,
      config_key = config_key,
      registry_key = registry_key,
      config = config,
      now = now,
      left = reclaim(value_key, permits_key, config.rate, now - interval, true),
      latest = nil,
      suffixes = {},
    }
    batch.budgets[value_key] = budget
    table.insert(batch.order, budget)
  end

  local delay = 0
  if budget.left < permits then
    delay = wait_for(permits_key, permits - budget.left, interval, now)
    if max_wait >= 0 and delay > max_wait then
      return '1 ' .. fmt(delay) .. ' ' .. fmt(budget.left) .. ' ' .. fmt(now)
    end
  end

  local start = now + delay
  local member = log_grant(permits_key, permits, start, budget.suffixes)
  budget.left = budget.left - permits
  budget.latest = math.max(budget.latest or start, start)
  if config.type == 'PER_CLIENT' then
    budget.client_id = client_id
  end
  return '0 ' .. fmt(budget.left) .. ' ' .. fmt(start) .. ' ' .. fmt(delay) .. ' ' .. member
end

-- Writes every budget a batch granted from, once.
local function save_clock(config)
  if config.clock_moved then
    redis.call('HSET', config.key, 'clock', fmt(config.clock))
    config.clock_moved = false
  end
end

local function close_batch(batch)
  for _, budget in ipairs(batch.order) do
    close_budget(budget)
  end
  for _, config in pairs(batch.configs) do
    if config then
      save_clock(config)
    end
  end
end
