-- The token bucket, kept as counters (counters.lua); the Python twin is
-- backends/memory/_token_bucket.py. Per rate a = the time at which its bucket is full again
-- (GCRA's theoretical arrival time), exactly: a + b/rate microseconds; a bucket of `rate`
-- tokens refills one token per interval/rate.

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

-- How many of the `permits` tokens of a grant that started at `start` have come back by
-- `now`, at least: the bucket refills oldest first, a token per interval/rate, and the
-- grant's first token comes back no earlier than one such step after its start.
local function refilled_since(r, permits, start, now)
  if now - start >= r.interval then
    return permits
  end
  local back = math.floor((now - start) * r.rate / r.interval)
  if back < permits and cost(r, back + 1) <= now - start then
    back = back + 1 -- (the product in doubles may round down)
  end
  return math.min(back, permits)
end

ALGORITHMS.TOKEN_BUCKET = counters({
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
    return math.floor(((r.interval - (tat - now)) * r.rate - frac) / r.interval)
  end,
  start = function(r, tat, frac, permits, now)
    tat, frac = refilled(r, tat, frac, now, permits)
    return tat - r.interval + (frac > 0 and 1 or 0)
  end,
  take = function(r, tat, frac, permits, start)
    return refilled(r, tat, frac, start, permits)
  end,
  tag = function(r, tat, frac, permits, start)
    return tat - start -- the bucket's full time after it, from its start
  end,
  until_ = function(r, tat, frac)
    return tat + (frac > 0 and 1 or 0)
  end,
  release = function(r, tat, frac, wanted, start, now)
    -- Tokens go back, never above a full bucket.
    if not (tat > now or (tat == now and frac > 0)) then
      return 0, tat, frac
    end
    if start and now > start then
      wanted = wanted - refilled_since(r, wanted, start, now)
      if wanted <= 0 then
        return 0, tat, frac
      end
    end
    local count = math.min(wanted, math.ceil(((tat - now) * r.rate + frac) / r.interval))
    local whole, rest = cost(r, wanted)
    tat, frac = tat - whole, frac - rest
    if frac < 0 then
      tat, frac = tat - 1, frac + r.rate
    end
    if tat < now then
      tat, frac = now, 0
    end
    return count, tat, frac
  end,
})
