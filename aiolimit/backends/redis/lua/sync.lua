-- sync: a provider's own count taken as a floor (Backend.sync): from now until now + reset,
-- each rate allows at most `remaining` more permits. Never frees what the limiter counts.
--
-- KEYS[1] config hash
-- KEYS[2] value key      (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET   (the client's own for PER_CLIENT)
-- KEYS[4] the clients registry (PER_CLIENT only)
-- ARGV[1] remaining: permits the provider still allows (0 to MAX_EXACT)
-- ARGV[2] reset: microseconds from now until the provider's count starts over
-- ARGV[3] now in microseconds, or '' to read the server's TIME
-- ARGV[4] rate type the caller built KEYS for
-- ARGV[5] the client id (PER_CLIENT: registered, as a grant's, when its state is written)
--
-- Per algorithm (`sync`): a token bucket is full no earlier than `remaining` tokens' refill
-- before one interval after the reset; a sliding window logs what the provider counts beyond
-- its started grants as an entry that leaves the window at the reset (in place of the last
-- count's entry: the provider's newest count is its count), and holds its grants
-- as long as the provider's count lasts (a lag: sliding_floors.lua), and fixed windows carry the floor into the window
-- the reset falls in (carries.lua): past the current window's end, the current one allows no
-- more than `remaining` and the next starts from rate - remaining and every grant since,
-- until the reset: both for at most one interval of the rate (a reset further on counts
-- until then). One bounded call.
-- Returns {0, 0}, {-1} without config, {-3, type} for the other rate type.

local config, trouble = budget_config(KEYS[1], ARGV[4])
if not config then
  return trouble
end
local now = limiter_now(config, ARGV[3])
local remaining, reset_us = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (remaining and reset_us) then
  error('aiolimit: sync needs remaining and reset, not ' .. ARGV[1] .. ' and ' .. ARGV[2])
end
save_clock(config)
local group = load_group(config, KEYS[2], KEYS[3], true)
group.algorithm.reclaim(group, now, true)
group.algorithm.sync(group, remaining, reset_us, now)
register_client(config, KEYS[4], ARGV[5], now, group.algorithm.save(group, now)) -- (registered.lua)
return { 0, 0 }
