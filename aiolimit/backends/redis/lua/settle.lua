-- settle: the grant `member` now counts `permits` instead of what it reserved (Backend.settle).
--
-- KEYS[1] config hash
-- KEYS[2] value key      (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET   (the client's own for PER_CLIENT)
-- KEYS[4] PER_CLIENT: the clients registry, then (KEYS[5]) the limiter's receipts; OVERALL:
--         the receipts (release.lua's ZSET "<tag>:released")
-- ARGV[1] the grant's member (Grant.member, "<permits>:<start>:<tag>:<life>")
-- ARGV[2] the permits it counts from now on (0 to MAX_EXACT)
-- ARGV[3] now in microseconds, or '' to read the server's TIME
-- ARGV[4] rate type the caller built KEYS for
-- ARGV[5] the member's receipt, as release.lua's: "<member>[ <client id>]"
-- ARGV[6] the client id (PER_CLIENT: registered, as a grant's, when its state is written)
-- ARGV[7] who settles ("<process>:<client id>"), or ''/absent: a settle that hands permits
--         back publishes "<permits> <who>" on the limiter's refund channel T:refunded, so
--         that paced waiters elsewhere ask again (_refunds.py); '' tells no one
-- ARGV[8] kept: what a paused waiter of the settler's process lacks (0/absent: none); when
--         the permits handed back cover it, that waiter takes them first and only the rest
--         is told (nothing when none is left), else all of them
-- ARGV[9], ARGV[10] (optional, Backend.settle_and_sync) remaining and reset (µs): after the
--         settle, a provider's count taken as a floor, as sync.lua takes it (a resend, or a
--         settle that changes nothing, still syncs)
--
-- Fewer: what of the difference still counts against the limit goes back, by the
-- algorithm's rule for a grant handed back (`shrink`; a token bucket with reservations
-- queued behind the grant gives back nothing, even for a grant that has started: their
-- starts count its tokens, and the bucket, one number, cannot hold a hole before them, so a
-- refund would hand a reservation's slot to a newcomer as well: docs/token-budgets.md).
-- More: the difference is taken now, whatever is free (`charge`): a debt, down to the
-- config's 'max_debt' (default: the smallest rate's permits) below zero of the fewest
-- permits left, reservations included (`room`); what would go further is cut. Later grants
-- wait until the debt is paid off, in order; reservations made already keep their starts.
-- A settle that changes the grant remembers the old member's receipt (as release.lua does)
-- while it could count, and at least RECEIPT_US: a resend finds it and changes nothing, and
-- so does a release of the old member. A member the budget no longer holds (gone from a
-- sliding window's log) gives nothing back; for more it is charged. A member of another life
-- than the config's (taken before the limiter was deleted, reset or flushed: lib.lua)
-- changes nothing at all: its grant's state is gone, and this state's grants are not its.
-- One bounded call: a ZSCORE and a few writes per rate (and sync.lua's, with a floor).
-- Returns {0, handed back, charged, member from now on, cut} (_protocol.SETTLE_FORMAT),
-- {-1} without config, {-3, type} for the other rate type.

local RECEIPT_US = 60000000

local config, trouble = budget_config(KEYS[1], ARGV[4])
if not config then
  return trouble
end
local now = limiter_now(config, ARGV[3])
local member, permits = ARGV[1], tonumber(ARGV[2])
local grant, life = split_life(member)
local reserved, start = parse_grant(grant)
if not (reserved and permits) then
  error('aiolimit: settle needs a grant\'s member and permits, not ' .. member .. ' and ' .. ARGV[2])
end
local remaining, reset_us = tonumber(ARGV[9] or ''), tonumber(ARGV[10] or '')
if ARGV[9] and not (remaining and reset_us) then
  error('aiolimit: settle needs remaining and reset, not ' .. ARGV[9] .. ' and ' .. tostring(ARGV[10]))
end
local receipts, receipt = KEYS[#KEYS], ARGV[5]
redis.call('ZREMRANGEBYSCORE', receipts, '-inf', fmt(now))
local unchanged = permits == reserved or life ~= config.life or redis.call('ZSCORE', receipts, receipt)
if unchanged and not remaining then
  return { 0, 0, 0, member, 0 } -- nothing to change, a grant of another life, or sent again
end
save_clock(config)
local group = load_group(config, KEYS[2], KEYS[3], true)
local algorithm = group.algorithm
algorithm.reclaim(group, now, true)
local back, charged, cut, settled = 0, 0, 0, grant
if unchanged then -- (the floor alone)
elseif permits < reserved then
  back, settled = algorithm.shrink(group, grant, reserved - permits, now)
else
  local extra = permits - reserved
  local max_debt = config.max_debt and tonumber(config.max_debt) or config.max_permits
  charged = max(0, min(extra, algorithm.room(group, now) + max_debt))
  cut = extra - charged
  if charged > 0 then
    settled = algorithm.charge(group, grant, charged, now)
  end
end
if remaining then
  algorithm.sync(group, remaining, reset_us, now)
end
register_client(config, KEYS[4], ARGV[6], now, algorithm.save(group, now)) -- (registered.lua)
local kept, told = tonumber(ARGV[8] or '') or 0, back
if kept > 0 and kept <= back then
  told = back - kept
end
if told > 0 and ARGV[7] and ARGV[7] ~= '' then
  redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -7) .. 'refunded', fmt(told) .. ' ' .. ARGV[7])
end
if settled == grant then
  settled = member
else
  settled = settled .. ':' .. life
  local until_ = max(start + config.longest, now + RECEIPT_US)
  redis.call('ZADD', receipts, fmt(until_), receipt)
  if redis.call('PTTL', receipts) < ms(until_ - now) then
    redis.call('PEXPIRE', receipts, ms(until_ - now))
  end
end
return { 0, back, charged, settled, cut }
