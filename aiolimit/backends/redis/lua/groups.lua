-- The groups: every rate of one budget, through its algorithm (part of the core, right after
-- lib.lua in the library; each algorithm's file follows and fills in ALGORITHMS).
--
-- A group is one budget's state under every rate of its config, loaded for one call. Each
-- algorithm is a table in ALGORITHMS of these functions, each taking the group first (the
-- memory backend's twin is backends/memory/_algorithm.py, `Group`):
--   load(group, write)             reads the state (group.config, .value_key, .permits_key);
--                                  sets group.fresh when none is stored. With `write`,
--                                  state that belongs to no limiter is dropped.
--   reclaim(group, now, write)     forgets the grants that no longer count at `now`; without
--                                  `write` nothing is written (what went is only not counted)
--   left(group, now)               permits a request could take at `now` (negative while
--                                  reservations are queued), and the rate that has the
--                                  fewest left (its number; the first of several such)
--   start(group, permits, now)     the earliest time every rate allows `permits` (spacing and
--                                  blocks aside); nil when a log would exceed MAX_EXACT
--   latest(group)                  the latest grant's start where a spacing or several rates
--                                  need it (nil: none)
--   commit(group, permits, start)  takes `permits` at `start` in every rate; the tag of the
--                                  grant's member (GRANTED)
--   grant_now(group, permits, now) for a config of one rate and no spacing (config.lane):
--                                  what start, commit and left come to for a grant at
--                                  `now` (its tag and the permits left), nil when `permits`
--                                  are not free then; batch.lua's `acquire` asks it first
--   keep(group)                    marks every stored part for `save` to write back
--   save(group, now)               writes back what changed; the longest TTL in ms (0: gone)
--   release(group, wanted, member, now)  hands back `wanted` permits from the latest grants
--                                  (member nil), or what the grant `member` still holds
--                                  against the limit; how many went back
--   queued(group, now)             the permits reserved to start after `now` (at least; of
--                                  the rate that has the most) and the latest such start,
--                                  or nil: what a reset must not forget (set_rate.lua)
--   rates_changed(group, olds, old_epochs, now)  set_rate with keep_state, once the group is
--                                  loaded and reclaimed: what the new rates do to the stored
--                                  state (`olds` the old config's rates, {rate, interval}
--                                  each; `old_epochs` its field 'epochs'); true when every
--                                  PER_CLIENT client's state must now live longer than its
--                                  TTL says, though no interval grew (set_rate.lua refreshes
--                                  them). Nothing, for most: the state follows the new rates
--                                  at its next grant, and lives as long
--   idempotent                     (a flag) handing back one grant twice returns it once by
--                                  the state alone, without a receipt (release.lua)
--   in_hash                        (a flag) an OVERALL budget keeps its state in the config
--                                  hash (field 'state'), not in value keys (config.in_hash)
-- Each rate tells the earliest start at which it allows a request; every rate allows it from
-- then on (given that a start is never before the latest one), so the request starts at the
-- latest of them, no earlier than the latest grant, nor than it plus the spacing.

local function load_group(config, value_key, permits_key, write)
  -- (Every field a group may be given is named here, so the table is allocated once.)
  local group = {
    config = config, value_key = value_key, permits_key = permits_key,
    algorithm = ALGORITHMS[config.algorithm],
    fresh = false, dirty = false, n = false, last = false, tail = false, held = false, budgets = false,
    handbacks = false, handed = false, carries = false, tail_until = false,
    -- (batch.lua's)
    now = false, registry_key = false, latest = false, client_id = false,
    closed = false,
  }
  group.algorithm.load(group, write)
  return group
end

-- The earliest start (>= now) at which every rate, the spacing and any block allow `permits`;
-- nil when a log would hold more than MAX_EXACT.
local function earliest(group, permits, now)
  local config = group.config
  local start = group.algorithm.start(group, permits, now)
  if not start then
    return nil
  end
  local last = group.algorithm.latest(group)
  if last then
    start = max(start, last + config.spacing)
  end
  if config.blocked_until then
    start = max(start, config.blocked_until)
  end
  return start
end

-- After a call rewrote the config's rates in its hash (learn.lua, margin.lua): the config read
-- again, under the clock the call holds, and the budget's state kept as set_rate.lua's
-- keep_state keeps it (grants made stay counted). Returns the config read again.
local function rates_rewritten(config, config_key, value_key, permits_key, now)
  local olds, old_epochs, clock = config.rates, config.epochs, config.clock
  config = load_config(config_key)
  config.clock = clock
  local group = load_group(config, value_key, permits_key, true)
  group.algorithm.reclaim(group, now, true)
  group.algorithm.rates_changed(group, olds, old_epochs, now)
  group.algorithm.keep(group)
  if not group.fresh then
    group.algorithm.save(group, now)
  end
  return config
end

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
  group.algorithm.keep(group)
  return group.algorithm.save(group, now)
end
