-- lease_many: attempts (lease_take) and releases (lease_release) made together, in order, as
-- one call: the limiter's state read and written once, the time read once, what had ended
-- reclaimed once (lease_lib.lua).
--
-- KEYS  the lease keys of each limiter named, once: T:sem, T:holders, T:queue, T:tickets
-- ARGV  one request each: "<where its limiter's keys start in KEYS> <permits> <ticket>
--       <wait us>" an attempt, "<start> <lease id> <process>" a release
--
-- Returns one reply per request, in order, each what lease_take or lease_release returns.

local now = now_us()
local states, keysets, replies = {}, {}, {}
for i, request in ipairs(ARGV) do
  local start, a, b, c = match(request, '^(%d+) (%S+) (%S+) ?(%S*)$')
  start = start + 0
  local keys, state = keysets[start], states[start]
  if not keys then -- (a limiter first named: its keys, its state read)
    keys = { KEYS[start], KEYS[start + 1], KEYS[start + 2], KEYS[start + 3] }
    state = LEASE.load(keys[1]) or false
    keysets[start], states[start] = keys, state
  end
  if c ~= '' then
    replies[i] = LEASE.take(state or nil, keys, now, a + 0, b, c + 0)
  else
    replies[i] = LEASE.release(state or nil, keys, now, a, b)
  end
end
for _, state in pairs(states) do
  if state then
    LEASE.save(state)
  end
end
return replies
