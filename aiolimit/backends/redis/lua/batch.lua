-- Acquiring: the requests of acquire.lua and acquire_many.lua, prepended to those two scripts
-- after the core (lib.lua) and the algorithms.
--
-- acquire.lua runs one request, acquire_many.lua several (requests that arrived together); a
-- batch reads each limiter's config, the clock and each budget once, decides its requests in
-- order exactly as separate calls would, and writes each budget once. A request fails on its
-- own: everything that can fail is read before its grant is logged, and a failure is its
-- caller's reply alone, so no other request of the batch is lost or miscounted.
--
-- A request is "<permits> <now in us, or - for the server's TIME> <max wait in us, -1 for no
-- limit, ? for a foresight (see FORESEE)> <rate type> [<client id>]", where the rate type is
-- the one the caller built the keys for. When the permits are not free now but will be within
-- max wait, they are reserved: the grant is logged at the future time they become free, and
-- the caller sleeps until then, so waiters are served in the order they asked, across every
-- process, in one round trip each.
-- The reply to a request is one string (the codes are _protocol.Reply):
--   "0 <left> <binding> <start> <delay> <member> [<blocked until>]"
--                                         granted at `start` (us), `delay` us from now
--                                         (0: now; > 0: a reservation); the end of the
--                                         limiter's latest block() when it has one
--   "1 <wait> <left> <binding> <now>"     refused; wait = us until `permits` are free (a
--                                         foresight's reply, its wait 0 when free now)
--   "-1"                                  no config
--   "-2 <rate>"                           permits exceed the (smallest) rate
--   "-3 <type>"                           the keys were built for the other rate type
--   "-4"                                  queue full: more than 2^53 permits would be logged
--   "-5 <message>"                        the request failed (e.g. a key holds foreign data)
-- where `left` is the fewest permits left under any rate and `binding` the rate that has them
-- (its place in the config's rates, from 0; the first of several such): the formats
-- _protocol.GRANTED_FORMAT and REFUSED_FORMAT state.

-- Writes back a group that granted or changed (its logs are written as they go); once. A
-- PER_CLIENT client's score in the registry is written here; what the registry itself needs
-- (old clients dropped, its TTL) is noted for close_batch, once per registry per call.
local function close_group(batch, group)
  if group.closed then
    return
  end
  group.closed = true
  local config, now = group.config, group.now
  local ttl = group.algorithm.save(group, now)
  if not group.latest then
    return
  end
  if group.client_id then
    -- Scored by the client's latest grant, which an earlier reservation may lie beyond.
    -- ZADD's GT (Redis >= 6.2) moves a score only forwards, in one command. (Servers that
    -- tell scripts their version, Redis >= 7 and Valkey, have it; older ones read the score.)
    if (redis.REDIS_VERSION_NUM or 0) >= 0x060200 then
      redis.call('ZADD', group.registry_key, 'GT', fmt(group.latest), group.client_id)
    else
      local score = redis.call('ZSCORE', group.registry_key, group.client_id)
      if not score or tonumber(score) < group.latest then
        redis.call('ZADD', group.registry_key, fmt(group.latest), group.client_id)
      end
    end
    local registry = batch.registries[group.registry_key]
    if not registry then
      registry = { config = config, now = now, ttl = 0 }
      batch.registries[group.registry_key] = registry
      batch.registry_order[#batch.registry_order + 1] = group.registry_key
    end
    -- (with clock='client' the groups of one call may act at different times: the latest)
    registry.now = max(registry.now, now)
    registry.ttl = max(registry.ttl, ttl + ms(config.longest))
  end
  if config.keep_alive > 0 and not config.expires_at then
    redis.call('PEXPIRE', config.key, max(ms(config.keep_alive), ttl))
  end
end

local function new_batch()
  return {
    configs = {}, groups = {}, order = {}, checked = {}, registries = {}, registry_order = {},
    lane = false, lane_left = 0, lane_tag = 0, at = 0, -- (grant_alike)
  }
end

-- A client's first request after a PER_CLIENT reset (set_rate.lua's 'promised') that the
-- reset's clean-up (retire.lua) has not reached: a latest grant of its cleared state that lies
-- ahead counts against its new budget, as a grant of the new rate at that start.
local function keep_promise(group, config, now, client_id)
  local until_, retired = match(config.promised, '^(%d+) (%S+)$')
  if not (until_ and until_ + 0 > now) then
    return
  end
  local latest = redis.call('ZSCORE', retired, client_id)
  latest = latest and latest + 0
  if latest and latest > now then
    group.algorithm.commit(group, config.max_permits, latest)
    group.latest = latest
  end
end

local function open_group(batch, config, now, config_key, value_key, permits_key, registry_key, client_id)
  local group = batch.groups[value_key]
  if group and group.now ~= now then
    close_group(batch, group) -- another clock reading: write back and start over, as a new call would
    group = nil
  end
  if group then
    return group
  end
  if config.type == 'PER_CLIENT' and not batch.checked[registry_key] then
    -- The registry is written when the batch closes, where nothing may fail any more.
    local kind = redis.call('TYPE', registry_key)
    kind = kind.ok or kind
    if kind ~= 'zset' and kind ~= 'none' then
      error('aiolimit: ' .. registry_key .. ' holds a ' .. kind .. ', not aiolimit state; delete() the limiter')
    end
    batch.checked[registry_key] = true
  end
  group = load_group(config, value_key, permits_key, true)
  group.algorithm.reclaim(group, now, true)
  group.now = now
  group.registry_key = registry_key
  if group.fresh and config.promised and config.type == 'PER_CLIENT' then
    keep_promise(group, config, now, client_id)
  end
  batch.groups[value_key] = group
  batch.order[#batch.order + 1] = group
  return group
end

-- A request's max wait that asks for a foresight (_protocol.FORESEE): the reply the request
-- would get once every request before it in the call is decided, as the refused reply's
-- fields with the wait until its permits are free (0: now), and nothing taken.
local FORESEE = '?'

-- The pattern of a request's fields (see above), each captured as a string: acquire.lua
-- anchors it, acquire_many.lua matches its "<k> " before it in the same match.
local REQUEST = '(%d+) (%S+) (%S+) (%S+) ?(.*)$'

local function acquire(batch, config_key, value_key, permits_key, registry_key, permits, now_arg, max_wait, rate_type, client_id)
  if not client_id then
    error('aiolimit: a request is "<permits> <now> <max wait> <rate type> [<client id>]"')
  end
  local foresee = max_wait == FORESEE
  permits, max_wait = permits + 0, foresee and 0 or max_wait + 0 -- (+ 0: see `fmt` in lib.lua)
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

  -- (the server's TIME, once read, and a budget this call has opened at that time: the common
  -- case, found without a call)
  local now = now_arg == '-' and server_now or limiter_now(config, now_arg)
  local group = batch.groups[value_key]
  if not group or group.now ~= now then
    group = open_group(batch, config, now, config_key, value_key, permits_key, registry_key, client_id)
  end
  local algorithm = group.algorithm
  if foresee then -- (the start it would get, after every request before it; nothing taken)
    local start = earliest(group, permits, now)
    if not start then
      return '-4'
    end
    local left, binding = algorithm.left(group, now)
    return format('1 %d %d %d %d', start - now, left, binding - 1, now)
  end
  -- One rate, no spacing (config.lane), no block ahead and no grant of this call past `now`:
  -- where the algorithm allows the permits now, that is what the steps below come to, in
  -- one call.
  if config.lane and (group.latest or now) <= now and (config.blocked_until or now) <= now then
    local tag, left = algorithm.grant_now(group, permits, now)
    if tag then
      group.latest = now
      if config.type == 'PER_CLIENT' then
        group.client_id = client_id
      end
      batch.lane, batch.lane_left, batch.lane_tag = group, left, tag -- (see grant_alike)
      return granted(left, 0, now, 0, permits, tag, config.life, config.blocked_until)
    end
  end
  local start = earliest(group, permits, now)
  if not start then
    return '-4'
  end
  local delay = start - now
  if delay > 0 and max_wait >= 0 and delay > max_wait then
    local left, binding = algorithm.left(group, now)
    return format('1 %d %d %d %d', delay, left, binding - 1, now)
  end

  -- Nothing below can fail: the grant, and the state that counts it, are written together.
  local tag = algorithm.commit(group, permits, start)
  group.latest = max(group.latest or start, start)
  if config.type == 'PER_CLIENT' then
    group.client_id = client_id
  end
  local left, binding = algorithm.left(group, now)
  -- (config.blocked_until: this limiter has been blocked, see block.lua)
  return granted(left, binding - 1, start, delay, permits, tag, config.life, config.blocked_until)
end

-- Runs one request; a failure becomes its own "-5" reply.
local function try_acquire(batch, config_key, value_key, permits_key, registry_key, ...)
  local ok, reply = pcall(acquire, batch, config_key, value_key, permits_key, registry_key, ...)
  if ok then
    return reply
  end
  return '-5 ' .. error_text(reply)
end

-- Alike requests (the same fields: the tasks of one process asking one budget alike) come one
-- after another in a call. Once one of them was granted at once on a lane (`acquire` leaves
-- its group in batch.lane), nothing `acquire` checks has changed for the next: the same
-- config, time and budget, whose latest grant is `now`. So the next take grant_now alone,
-- each with the reply `acquire` would give it, until one is not free now: that one goes
-- through `acquire` like any other. Returns the first request not granted here.
-- A reply that differs from the one before it only by `permits` fewer left and its tag (the
-- usual case) is sent as '=' and how far the tag moved, when not 1 (_protocol.SAME_FORMAT):
-- a reply line costs about as much as the grant itself, and the client writes it out.
local function grant_alike(batch, replies, i, last, group, permits)
  local grant_now, now, config = group.algorithm.grant_now, group.now, group.config
  local life, blocked_until = config.life, config.blocked_until
  local left_before, tag_before = batch.lane_left, batch.lane_tag
  while i <= last do
    batch.at = i
    local tag, left = grant_now(group, permits, now)
    if not tag then
      return i
    end
    if left == left_before - permits then
      local step = tag - tag_before
      replies[i] = step == 1 and '=' or '=' .. (FMT[step] or fmt(step))
    else
      replies[i] = granted(left, 0, now, 0, permits, tag, life, blocked_until)
    end
    left_before, tag_before = left, tag
    i = i + 1
  end
  return i
end

-- Runs the alike requests first..last, their replies in replies[first..last], each as
-- try_acquire would: a failure is its own request's "-5" reply alone.
local function acquire_alike(batch, replies, first, last, config_key, value_key, permits_key, registry_key, permits, ...)
  local i = first
  while i <= last do
    batch.lane = false
    replies[i] = try_acquire(batch, config_key, value_key, permits_key, registry_key, permits, ...)
    i = i + 1
    local group = batch.lane
    if group and i <= last then
      local ok, after = pcall(grant_alike, batch, replies, i, last, group, permits)
      if ok then
        i = after
      else
        replies[batch.at] = '-5 ' .. error_text(after)
        i = batch.at + 1
      end
    end
  end
end

-- Writes every group a batch granted from, each registry it wrote to, and every clock it
-- moved, once.
local function close_batch(batch)
  local order, registry_order = batch.order, batch.registry_order
  for k = 1, #order do
    close_group(batch, order[k])
  end
  for k = 1, #registry_order do
    local registry_key = registry_order[k]
    local registry = batch.registries[registry_key]
    local config, now = registry.config, registry.now
    redis.call('ZREMRANGEBYSCORE', registry_key, '-inf', fmt(now - 2 * config.longest))
    extend_registry(registry_key, registry.ttl, config, now)
  end
  for _, config in pairs(batch.configs) do
    if config then
      save_clock(config)
    end
  end
end
