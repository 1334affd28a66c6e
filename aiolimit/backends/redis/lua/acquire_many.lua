-- acquire_many: several acquire requests in one call (requests that arrived together), at most
-- 64 of them (MAX_BATCH in _protocol.py): a script blocks the whole server while it runs.
--
-- KEYS   the keys of every limiter budget in the batch, each budget's once: config hash,
--        value key, permits ZSET, and for PER_CLIENT the clients registry (as for acquire.lua)
-- ARGV   one per request: "<k> <request>", where KEYS[k] is the request's config hash (its
--        other keys follow it) and <request> is as for acquire.lua
--
-- Returns the reply strings of the requests (see batch.lua's header), in order, joined by
-- newlines into one string; a grant's reply that is the one before it with `permits` fewer
-- left and another tag is "=<tag step>" (SAME_FORMAT in _protocol.py). Requests run one after another,
-- exactly as if they had been sent as separate acquire calls; one that fails gets its own
-- "-5" reply and changes nothing.

local batch = new_batch()
local replies = {}
local pattern = '^(%d+) ' .. REQUEST
local count, first = #ARGV, 1
while first <= count do
  -- A run of alike requests (equal strings are one object: one comparison each) is read once.
  local request, last = ARGV[first], first
  while last < count and ARGV[last + 1] == request do
    last = last + 1
  end
  local k, permits, now, max_wait, rate_type, client_id = match(request, pattern)
  if k then -- (read as numbers once; a max wait that is no number stays text, which `acquire` refuses)
    k, permits, max_wait = k + 0, permits + 0, tonumber(max_wait) or max_wait
  else
    k = 1
  end
  if last == first then
    replies[first] = try_acquire(batch, KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], permits, now, max_wait, rate_type, client_id)
  else
    acquire_alike(batch, replies, first, last, KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], permits, now, max_wait, rate_type, client_id)
  end
  first = last + 1
end
close_batch(batch)
return table.concat(replies, '\n')
