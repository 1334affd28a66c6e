-- The token bucket, kept as counters (counters.lua); the Python twin is
-- backends/memory/_token_bucket.py. Per rate a = the time at which its bucket is full again
-- (GCRA's theoretical arrival time), exactly: a + b/rate microseconds; a bucket of `rate`
-- tokens refills one token per interval/rate.

-- The refill that n tokens of rate r cost, n * interval / rate microseconds, exactly: whole
-- microseconds and the rest in 1/rate of a microsecond. (Past 2^53 a product is not exact
-- in a double: the cost is then rounded up to whole microseconds, never down.) r is one of
-- a config's rates (new_rate in lib.lua: interval = q * rate + rem, rem < rate).
local function cost(r, n)
  if n == 1 then
    return r.q, r.rem
  end
  local rest = n * r.rem
  if rest >= MAX_EXACT then
    return n * r.q + ceil(rest / r.rate), 0
  end
  local whole = floor(rest / r.rate)
  return n * r.q + whole, rest - whole * r.rate
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

-- The earliest start of a grant after which the bucket is full at (tat, frac): one interval
-- before, in whole microseconds, rounded up.
local function first_start(r, tat, frac)
  return tat - r.interval + (frac > 0 and 1 or 0)
end

-- set_rate with keep_state: a bucket keeps the tokens missing from it at the change (`at`),
-- refilled at the new rate from then on (rounded up to a whole microsecond, never down).
-- `was` is the rate that wrote (tat, frac), r the new one.
local function converted(was, r, tat, frac, at)
  local due = tat - at + (frac > 0 and 1 or 0)
  if due > 0 and (was.rate ~= r.rate or was.interval ~= r.interval) then
    return at + ceil(due * was.rate * r.interval / (was.interval * r.rate)), 0
  end
  return tat, frac
end

-- A PER_CLIENT bucket cannot be converted by set_rate (O(1) for any number of clients): its
-- client's next call does it. So the generation a client's state carries says which rates
-- wrote it: "<gen>.<epoch>" (no ".<epoch>": 0), the epoch moved on by each set_rate that
-- keeps the state and changes the rates; and the config keeps the rates of the last
-- EPOCHS_KEPT epochs before its own, in the field 'epochs': "<epoch> <at> <rates>|..."
-- (newest first; `at` the change that ended it, <rates> "<rate>:<interval>,...").
local EPOCHS_KEPT = 4

-- The base generation and the rates epoch of a generation.
local function split_gen(gen)
  local base, epoch = match(gen, '^(.-)%.(%d+)$')
  if base then
    return base, tonumber(epoch)
  end
  return gen, 0
end

-- The config's earlier epochs: {[epoch] = {at = ..., rates = {{rate, interval}, ...}}}.
local function parse_epochs(text)
  local epochs, count = {}, 0
  for epoch, at, rates in string.gmatch(text or '', '(%d+) (%d+) ([%d:,]+)') do
    count = count + 1
    if count > EPOCHS_KEPT then
      break -- (written by set_rate: never more)
    end
    local list = {}
    for p, i in string.gmatch(rates, '(%d+):(%d+)') do
      list[#list + 1] = { rate = tonumber(p), interval = tonumber(i) }
    end
    epochs[tonumber(epoch)] = { at = tonumber(at), rates = list }
  end
  return epochs
end

local bucket = counters({
  -- A client's state of an earlier rates epoch of this config (nil: not this config's): a
  -- function of (i, tat, frac) converting rate i's numbers through every change since,
  -- each at its time, as set_rate converts an OVERALL bucket. An epoch older than those
  -- kept converts nothing: the bucket keeps its full time.
  adopt = function(config, gen)
    local base, epoch = split_gen(gen)
    local current_base, current = split_gen(config.gen)
    if base ~= current_base or epoch >= current then
      return nil
    end
    local epochs = parse_epochs(config.epochs or nil) -- (read with the config)
    return function(i, tat, frac)
      for e = epoch, current - 1 do
        if not epochs[e] then
          break
        end
        local was, r = epochs[e].rates[i], (epochs[e + 1] or config).rates[i]
        if not (was and r) then
          return 0, 0 -- a rate added since: a full bucket; one removed: forgotten
        end
        tat, frac = converted(was, r, tat, frac, epochs[e].at)
      end
      return tat, frac
    end
  end,
  loaded = function(r, tat, frac)
    if frac >= r.rate then -- a remainder of another rate: a whole us, rounded up
      return tat + 1, 0
    end
    return tat, frac
  end,
  left = function(r, tat, frac, now)
    if tat < now or (tat == now and frac == 0) then
      return r.rate
    end
    return floor(((r.interval - (tat - now)) * r.rate - frac) / r.interval)
  end,
  start = function(r, tat, frac, permits, now)
    tat, frac = refilled(r, tat, frac, now, permits)
    return first_start(r, tat, frac)
  end,
  take = function(r, tat, frac, permits, start)
    return refilled(r, tat, frac, start, permits)
  end,
  take_now = function(r, tat, frac, permits, now)
    tat, frac = refilled(r, tat, frac, now, permits)
    if first_start(r, tat, frac) <= now then -- (start's test, on the same refill)
      return tat, frac
    end
    return nil
  end,
  tag = function(r, tat, frac, permits, start)
    return tat - start -- the bucket's full time after it, from its start
  end,
  span = function(r)
    return r.interval -- (a grant starts no earlier than one interval before its full time)
  end,
  queued = first_start,
  ahead = function(r, tat, frac, now)
    local latest = first_start(r, tat, frac)
    if latest <= now then
      return 0, latest
    end
    -- (a token per interval/rate from now on: the grants that start after now hold them)
    return ceil((latest - now) * r.rate / r.interval), latest
  end,
  until_ = function(r, tat, frac)
    return tat + (frac > 0 and 1 or 0)
  end,
  release = function(r, tat, frac, wanted, start, now, held)
    -- Tokens go back, never above a full bucket.
    if not (tat > now or (tat == now and frac > 0)) then
      return 0, tat, frac
    end
    local whole, rest = cost(r, wanted)
    if start and now > start then
      -- Of the refill the grant's `held` tokens cost, what has passed since its start is paid
      -- (oldest first): only the rest goes back, to the microsecond. The bucket, had the
      -- grant never taken them, could have been full meanwhile, and the refill it would have
      -- lost is no refund's to give (it would let more start within an interval than the
      -- bucket allows).
      local due, due_rest = cost(r, held)
      due = due - (now - start)
      if due < 0 or (due == 0 and due_rest == 0) then
        return 0, tat, frac
      end
      if due < whole or (due == whole and due_rest < rest) then
        whole, rest = due, due_rest
      end
    end
    local count = min(wanted, ceil((whole * r.rate + rest) / r.interval), ceil(((tat - now) * r.rate + frac) / r.interval))
    tat, frac = tat - whole, frac - rest
    if frac < 0 then
      tat, frac = tat - 1, frac + r.rate
    end
    if tat < now then
      tat, frac = now, 0
    end
    return count, tat, frac
  end,
  -- (settle.lua, sync.lua: see `settling` in counters.lua)
  charge = function(r, tat, frac, extra, now)
    return refilled(r, tat, frac, now, extra) -- past one interval on: a debt
  end,
  sync = function(r, tat, frac, remaining, reset_us, now)
    -- Full no earlier than `remaining` tokens' refill before one interval after the reset.
    if reset_us <= 0 then
      return tat, frac
    end
    local full = now + reset_us + r.interval - cost(r, remaining)
    if tat < full then
      return full, 0
    end
    return tat, frac
  end,
})
ALGORITHMS.TOKEN_BUCKET = bucket

-- An OVERALL bucket keeps the tokens missing from each rate's bucket, not the time it is full
-- again: they refill at the new rate from `now` (`converted`).
local function convert_buckets(group, olds, now)
  local n = group.n
  for i, r in ipairs(group.config.rates) do
    if olds[i] then
      n[2 * i - 1], n[2 * i] = converted(olds[i], r, n[2 * i - 1], n[2 * i], now)
    end
  end
end

local function format_rates(rates)
  local parts = {}
  for i, r in ipairs(rates) do
    parts[i] = fmt(r.rate) .. ':' .. fmt(r.interval)
  end
  return table.concat(parts, ',')
end

-- A PER_CLIENT bucket is converted at its client's next call (`adopt`): when the rates change,
-- the next rates epoch, its generation written, the old rates kept in 'epochs' (carried over
-- from the old config, `old_epochs`) with the time of the change.
local function next_epoch(config, olds, old_epochs, now)
  if old_epochs then
    config.epochs = old_epochs
    redis.call('HSET', config.key, 'epochs', old_epochs) -- (set_rate wrote the config afresh)
  end
  local rates = format_rates(olds)
  if rates == format_rates(config.rates) then
    return
  end
  local base, epoch = split_gen(config.gen)
  local kept = { fmt(epoch) .. ' ' .. fmt(now) .. ' ' .. rates }
  for entry in string.gmatch(old_epochs or '', '[^|]+') do
    if #kept == EPOCHS_KEPT then
      break
    end
    kept[#kept + 1] = entry
  end
  config.gen, config.epochs = base .. '.' .. fmt(epoch + 1), table.concat(kept, '|')
  redis.call('HSET', config.key, 'gen', config.gen, 'epochs', config.epochs)
end

-- Whether any rate refills more slowly than the one it replaces: a bucket converted to it
-- is full later than its old TTL.
local function slower(olds, rates)
  for i = 1, min(#olds, #rates) do
    if olds[i].rate * rates[i].interval > olds[i].interval * rates[i].rate then
      return true
    end
  end
  return false
end

function bucket.rates_changed(group, olds, old_epochs, now)
  if not group.config.in_hash then
    next_epoch(group.config, olds, old_epochs, now)
    -- (what a client owes takes longer to pay than its TTL says: set_rate.lua refreshes them)
    return slower(olds, group.config.rates)
  end
  if not group.fresh then
    convert_buckets(group, olds, now)
  end
  return false
end
