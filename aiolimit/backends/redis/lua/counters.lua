-- What the token bucket and fixed windows share: a budget kept as numbers, two per rate, whose
-- meaning each algorithm gives by its rule (token_bucket.lua, fixed_window.lua); the Python
-- twin is backends/memory/_counters.py.
--
-- A PER_CLIENT client's value key holds "<gen> <last> <a 1> <b 1> ... <a n> <b n>": the
-- config generation, the start of the latest grant ("-": none; kept only for the spacing and
-- for FIFO across several rates), then per rate its two numbers; then what an algorithm
-- keeps besides (group.tail, " ~..."; fixed_window.lua's earlier windows).
-- An OVERALL budget keeps the same numbers, without the generation, in its config hash: field
-- 'state', "<last> <a 1> <b 1> ...". One key instead of two halves the memory of such a
-- limiter and saves a GET per call. The field has no TTL of its own: it goes with the config
-- (delete, set_rate without keep_state, expire, keep_alive), and state that has run out is
-- harmless until the next write drops it: a bucket whose full time has passed is full, a
-- window that has ended holds nothing, whatever the rates.
--
-- A rule is a table of functions of one rate r ({rate, interval}) and its numbers a, b
-- (and, optionally, adopt(config, gen): see token_bucket.lua):
--   loaded(r, a, b)                  a, b as this rate reads numbers another rate may have
--                                    written (set_rate with keep_state)
--   left(r, a, b, now)               permits the rate allows at `now`
--   start(r, a, b, permits, now)     the earliest time it allows `permits` (may be < now)
--   take(r, a, b, permits, start)    a, b once `permits` are taken at `start`
--   take_now(r, a, b, permits, now)  take at `now` where start allows `permits` then (nil:
--                                    not then), for a budget of one rate (`grant_now`)
--   tag(r, a, b, permits, start)     what tells a grant from the budget's others that start
--                                    then, from the first rate's numbers after it
--   until_(r, a, b, config, now)     until when the numbers matter (kept_until, held.lua)
--   release(r, a, b, wanted, start, now, held)  count, a, b: `wanted` of the `held` permits
--                                    of the grant that started at `start` (nil: `wanted` of
--                                    the latest grants) handed back, no more than it still
--                                    holds at `now`
--   span(r)                          the largest tag it gives (see `tagged`)
--   ahead(r, a, b, now)              permits, start: at least the permits reserved to start
--                                    after `now`, and the latest such start (0: none)
--   queued(r, a, b)                  (optional) the start of the latest grant when it is a
--                                    reservation: a rule whose numbers cannot hold a hole
--                                    hands back only the latest grants (see `release`)
--
-- Hand-backs: a grant handed back frees its slot, so a later grant may take the same start
-- and numbers; the budget counts its hand-backs (group.handbacks, kept as the first entry
-- of the tail, " ~h<count>") and a grant's tag carries the count, so that no member is ever
-- issued twice (a receipt would take the second grant's hand-back for a resend of the
-- first's). The count is kept while the latest grant handed back (group.handed: its start)
-- could still count, one longest interval from its start, as its receipt is (release.lua):
-- a grant at that start, even after the numbers have run out, must see it; and past every
-- write that sees it. A sliding window keeps its sequence numbers by the same rule
-- (sliding_log.lua).

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

-- The tail of a state: its hand-back count (group.handbacks) and what an algorithm keeps
-- besides (group.tail).
local function split_handbacks(group, tail)
  local count, rest = match(tail, '^ ~h(%d+)(.*)$')
  if count then
    group.handbacks, tail = tonumber(count), rest
  end
  if tail ~= '' then
    group.tail = tail
  end
end

-- Reads the numbers into group.n (a full bucket / no window for a rate without state).
local function load_counters(group, rule, write)
  local config = group.config
  local rates, n = config.rates, {}
  group.n, group.fresh = n, true
  -- at: where <last> stands (after the generation in a value key)
  local raw, at = config.state, 1
  if not config.in_hash then
    raw, at = redis.call('GET', group.value_key), 2
  end
  if raw and #rates == 1 then
    -- One rate, the common case: one match. (A state another config wrote, with several
    -- rates, or more than its numbers, or of earlier rates, takes the general way below.)
    local gen, last, a, b, tail = config.gen, nil, nil, nil, nil
    if at == 1 then
      last, a, b, tail = match(raw, '^(%S+) (%-?%d+) (%-?%d+)(.*)$')
    else
      gen, last, a, b, tail = match(raw, '^(%S+) (%S+) (%-?%d+) (%-?%d+)(.*)$')
    end
    if a and gen == config.gen and (tail == '' or string.sub(tail, 1, 2) == ' ~') then
      group.fresh, group.last = false, tonumber(last)
      n[1], n[2] = rule.loaded(rates[1], a + 0, b + 0)
      if tail ~= '' then
        split_handbacks(group, tail)
      end
      return
    end
  end
  if raw then
    -- (what an algorithm keeps beyond its numbers, " ~...": fixed_window.lua's summary)
    local tail = string.find(raw, ' ~', 1, true)
    if tail then
      raw, tail = string.sub(raw, 1, tail - 1), string.sub(raw, tail)
      split_handbacks(group, tail)
    end
    local fields, count = {}, 0
    for field in string.gmatch(raw, '%S+') do
      count = count + 1
      fields[count] = field
    end
    -- (a token bucket's client state of earlier rates: converted, see token_bucket.lua)
    local adopt = at == 2 and fields[1] ~= config.gen and rule.adopt and rule.adopt(config, fields[1])
    if (at == 1 or fields[1] == config.gen or adopt) and count >= at and (count - at) % 2 == 0 then
      -- (set_rate with keep_state may have changed the rates: each keeps its own state by
      -- position, a rate added starts afresh)
      group.fresh = false
      group.last = tonumber(fields[at])
      for i = 1, #rates do
        local a, b = tonumber(fields[2 * i - 1 + at] or '0'), tonumber(fields[2 * i + at] or '0')
        if adopt then
          a, b = adopt(i, a, b)
        end
        n[2 * i - 1], n[2 * i] = rule.loaded(rates[i], a, b)
      end
      return
    end
    if write then
      drop_counters(group) -- another generation's, or another config's
    end
  end
  for i = 1, 2 * #rates do
    n[i] = 0
  end
end

-- Writes the numbers back, with a TTL until they stop mattering; the TTL in ms (0: gone).
local function save_counters(group, rule, now)
  if not group.dirty then
    return 0
  end
  local config, n = group.config, group.n
  -- The state matters until every rate allows its full count again, the spacing has passed,
  -- and what the algorithm keeps besides no longer counts (group.tail_until: carries.lua).
  local until_ = max(group.last and (group.last + config.spacing) or 0, group.tail_until or 0)
  local rates = config.rates
  for i = 1, #rates do
    until_ = max(until_, rule.until_(rates[i], n[2 * i - 1], n[2 * i], config, now))
  end
  if group.handbacks then
    -- (a grant at this very time, or at a handed-back grant's start, must see the count)
    until_ = max(until_, now + 1, group.handed and group.handed + config.longest or 0)
  end
  if until_ <= now then
    drop_counters(group)
    return 0
  end
  local ttl = ms(until_ - now)
  if config.expires_at then
    ttl = max(min(ttl, ms(config.expires_at - now)), 1)
  end
  -- The latest start is kept only where a later request needs it: with several rates (for
  -- FIFO) or a spacing; one rate keeps its requests in order by itself. (A short value is
  -- stored by Redis in one allocation.)
  local keep_last = group.last and (#config.rates > 1 or config.spacing > 0)
  local state
  if #n == 2 then -- one rate: one concatenation
    state = (keep_last and fmt(group.last) or '-') .. ' ' .. fmt(n[1]) .. ' ' .. fmt(n[2])
  else
    local fields = { keep_last and fmt(group.last) or '-' }
    for i, number in ipairs(n) do
      fields[i + 1] = fmt(number)
    end
    state = table.concat(fields, ' ')
  end
  if group.handbacks then
    state = state .. ' ~h' .. fmt(group.handbacks)
  end
  if group.tail then
    state = state .. group.tail
  end
  if config.in_hash then
    -- No TTL of its own: the state goes with the config (see above).
    config.state = state
    redis.call('HSET', config.key, 'state', state)
  else
    redis.call('SET', group.value_key, config.gen .. ' ' .. state, 'PX', fmt(ttl))
  end
  return ttl
end

-- A grant's tag: the rule's, which tells it from the grants that start then, moved past
-- every tag the rule gives (0..span) once per hand-back the budget has seen (see above). The
-- count wraps where the tag would no longer be exact: a member is then issued again only
-- after that many hand-backs of grants of the same start and permits.
local function tagged(group, rule, r, tag)
  local count = group.handbacks
  if not count then
    return tag
  end
  local span = rule.span(r) + 1
  return tag + (count % max(1, floor((MAX_EXACT - span) / span))) * span
end

-- settle.lua's and sync.lua's group functions of an algorithm kept as counters (the rule's
-- `charge` and `sync`, per rate; a settle for fewer is the rule's `release`):
--   charge(r, a, b, extra, now)      a, b once `extra` permits are taken at `now`, whatever
--                                    is free (a debt; settle.lua bounds it)
--   sync(r, a, b, remaining, reset_us, now)  a, b once the rate allows at most `remaining`
--                                    more until now + reset_us (fixed windows: carries.lua)
--   room(r, a, b, now)               (optional) `left`, less every permit reserved ahead:
--                                    what a debt is measured from (without it: `left`)
--   synced(group, i, a)              (on the algorithm, optional) rate i takes the new
--                                    numbers a, ... (fixed windows keep the window it leaves)
local function settling(algorithm, rule, queued_start)
  -- A settled grant's member: its tag moved past every tag the rule gives once more than
  -- any grant's (the hand-back count moved by two: one for it, one for the grants after).
  local function settled(group, permits, start, tag)
    local rates = group.config.rates
    group.handbacks, group.handed = (group.handbacks or 0) + 1, max(group.handed or start, start)
    local member = fmt(permits) .. ':' .. fmt(start) .. ':' .. fmt(tagged(group, rule, rates[1], tag % (rule.span(rates[1]) + 1)))
    group.handbacks = group.handbacks + 1
    group.dirty, group.fresh = true, false
    return member
  end
  function algorithm.shrink(group, member, wanted, now)
    local reserved, start, tag = parse_grant(member)
    local rates, n, back = group.config.rates, group.n, 0
    local latest = rule.queued and queued_start(group, now)
    if not latest or latest == start then -- (a token bucket: see `release`)
      for i = 1, #rates do
        local count
        count, n[2 * i - 1], n[2 * i] = rule.release(rates[i], n[2 * i - 1], n[2 * i], wanted, start, now, reserved)
        back = max(back, count)
      end
    end
    return back, settled(group, reserved - wanted, start, tag)
  end
  -- The fewest permits left under any rate, less those reserved ahead (settle.lua).
  function algorithm.room(group, now)
    local rates, n, least = group.config.rates, group.n, nil
    local room = rule.room or rule.left
    for i = 1, #rates do
      local l = room(rates[i], n[2 * i - 1], n[2 * i], now)
      least = min(least or l, l)
    end
    return least
  end
  function algorithm.charge(group, member, extra, now)
    local reserved, start, tag = parse_grant(member)
    local rates, n = group.config.rates, group.n
    for i = 1, #rates do
      local a, b = rule.charge(rates[i], n[2 * i - 1], n[2 * i], extra, now)
      if algorithm.synced and a ~= n[2 * i - 1] then
        algorithm.synced(group, i, a)
      end
      n[2 * i - 1], n[2 * i] = a, b
    end
    return settled(group, reserved + extra, start, tag)
  end
  function algorithm.sync(group, remaining, reset_us, now)
    local rates, n = group.config.rates, group.n
    for i = 1, #rates do
      local a, b = rule.sync(rates[i], n[2 * i - 1], n[2 * i], remaining, reset_us, now)
      if a ~= n[2 * i - 1] or b ~= n[2 * i] then
        if algorithm.synced and a ~= n[2 * i - 1] then
          algorithm.synced(group, i, a)
        end
        n[2 * i - 1], n[2 * i] = a, b
        group.dirty, group.fresh = true, false
      end
    end
  end
end

-- The group functions (see groups.lua) of an algorithm kept as counters by `rule`.
-- (Numeric loops over the rates: they run for every request of a batch.)
local function counters(rule)
  -- (an OVERALL budget's numbers are a field of its config: see above)
  local algorithm = { in_hash = true }
  function algorithm.load(group, write)
    load_counters(group, rule, write)
  end
  function algorithm.reclaim()
    -- the numbers say by themselves what has run out
  end
  function algorithm.left(group, now)
    local rates, n = group.config.rates, group.n
    local left, binding = rule.left(rates[1], n[1], n[2], now), 1
    for i = 2, #rates do
      local l = rule.left(rates[i], n[2 * i - 1], n[2 * i], now)
      if l < left then
        left, binding = l, i
      end
    end
    return left, binding
  end
  function algorithm.start(group, permits, now)
    local start, rates, n = now, group.config.rates, group.n
    for i = 1, #rates do
      start = max(start, rule.start(rates[i], n[2 * i - 1], n[2 * i], permits, now))
    end
    return start
  end
  function algorithm.latest(group)
    return group.last
  end
  -- A budget of one rate without a spacing (config.lane): takes `permits` at `now` if the
  -- rule allows them then; the grant's tag and the permits left after it (nil: not at
  -- `now`). What start, commit and left come to, in one call.
  function algorithm.grant_now(group, permits, now)
    local r, n = group.config.rates[1], group.n
    local a, b = rule.take_now(r, n[1], n[2], permits, now)
    if not a then
      return nil
    end
    n[1], n[2] = a, b
    group.last, group.dirty, group.fresh = now, true, false
    return tagged(group, rule, r, rule.tag(r, a, b, permits, now)), rule.left(r, a, b, now)
  end
  function algorithm.commit(group, permits, start)
    local rates, n = group.config.rates, group.n
    group.last = max(group.last or start, start)
    for i = 1, #rates do
      n[2 * i - 1], n[2 * i] = rule.take(rates[i], n[2 * i - 1], n[2 * i], permits, start)
    end
    group.dirty, group.fresh = true, false
    return tagged(group, rule, rates[1], rule.tag(rates[1], n[1], n[2], permits, start))
  end
  function algorithm.keep(group)
    group.dirty = not group.fresh
  end
  function algorithm.rates_changed()
    -- each rate reads its numbers as `loaded` says, whatever rate wrote them
    return false
  end
  function algorithm.save(group, now)
    return save_counters(group, rule, now)
  end
  -- The start of the latest grant when it is a reservation (nil: none), for a rule whose
  -- numbers cannot hold a hole (`queued`): the latest start kept, or else what the numbers say.
  local function queued_start(group, now)
    local rates, n, latest = group.config.rates, group.n, group.last
    if not latest then
      latest = rule.queued(rates[1], n[1], n[2])
      for i = 2, #rates do
        latest = max(latest, rule.queued(rates[i], n[2 * i - 1], n[2 * i]))
      end
    end
    return latest > now and latest or nil
  end
  function algorithm.queued(group, now)
    local rates, n, permits, latest = group.config.rates, group.n, 0, nil
    for i = 1, #rates do
      local p, start = rule.ahead(rates[i], n[2 * i - 1], n[2 * i], now)
      if p > 0 then
        permits, latest = max(permits, p), max(latest or start, start)
      end
    end
    if permits == 0 then
      return nil
    end
    return permits, max(latest, group.last or latest)
  end
  function algorithm.release(group, wanted, member, now)
    local start, released, rates, n = nil, 0, group.config.rates, group.n
    if member then
      wanted, start = parse_grant(member)
    end
    if rule.queued then
      -- Moving the numbers back for a grant that reservations are queued behind would let
      -- the next request start on a slot one of them holds: only the latest goes back.
      local latest = queued_start(group, now)
      if latest and latest ~= start then
        return 0
      end
    end
    for i = 1, #rates do
      local count
      count, n[2 * i - 1], n[2 * i] = rule.release(rates[i], n[2 * i - 1], n[2 * i], wanted, start, now, wanted)
      released = max(released, count)
    end
    if released > 0 then
      group.dirty, group.handbacks = true, (group.handbacks or 0) + 1
      group.handed = max(group.handed or now, start or now)
    end
    return released
  end
  settling(algorithm, rule, queued_start)
  return algorithm
end
