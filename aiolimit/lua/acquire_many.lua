-- acquire_many: several acquire requests in one call (requests that arrived together).
--
-- KEYS   for each request in order: config hash, value key, permits ZSET, and for a
--        PER_CLIENT request the clients registry (as for acquire.lua)
-- ARGV   one request string per request, as for acquire.lua
--
-- Returns one reply string per request, in order (see `acquire` in lib.lua). Requests run
-- one after another, exactly as if they had been sent as separate acquire calls.

local replies = {}
local k = 1
for i, request in ipairs(ARGV) do
  if string.match(request, '^%d+ %S+ %S+ (%S+)') == 'PER_CLIENT' then
    replies[i] = acquire(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], request)
    k = k + 4
  else
    replies[i] = acquire(KEYS[k], KEYS[k + 1], KEYS[k + 2], nil, request)
    k = k + 3
  end
end
return replies
