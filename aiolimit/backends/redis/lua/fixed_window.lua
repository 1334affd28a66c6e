-- Fixed windows, kept as counters (counters.lua); the Python twin is
-- backends/memory/_fixed_window.py. Per rate a = the end of the latest window holding grants
-- (windows are aligned to multiples of the interval since the Unix epoch; its end says which
-- it is under any interval, so a new interval keeps its count), b = the permits in it.

-- The number of the window that ends at `window_end` (-1: none yet).
local function window_of(r, window_end)
  return math.floor((window_end - 1) / r.interval)
end

ALGORITHMS.FIXED_WINDOW = counters({
  loaded = function(r, window_end, count)
    return window_end, count
  end,
  left = function(r, window_end, count, now)
    local window, current = window_of(r, window_end), math.floor(now / r.interval)
    return window < current and r.rate or (window == current and r.rate - count or 0)
  end,
  start = function(r, window_end, count, permits, now)
    local window = window_of(r, window_end)
    if window < math.floor(now / r.interval) then
      return now
    end
    if count + permits <= r.rate then
      return window * r.interval
    end
    return (window + 1) * r.interval
  end,
  take = function(r, window_end, count, permits, start)
    local window = math.floor(start / r.interval)
    if window == window_of(r, window_end) then
      count = count + permits
    else
      count = permits
    end
    return (window + 1) * r.interval, count
  end,
  tag = function(r, window_end, count, permits)
    return count - permits -- the permits its window held before it
  end,
  until_ = function(r, window_end)
    return (window_of(r, window_end) + 1) * r.interval
  end,
  release = function(r, window_end, count, wanted, start, now)
    -- Only the latest window's count is kept: a grant there (or, without a member, in the
    -- current window when nothing is reserved ahead) can go back.
    if math.floor((start or now) / r.interval) ~= window_of(r, window_end) then
      return 0, window_end, count
    end
    local back = math.min(wanted, count)
    return back, window_end, count - back
  end,
})
