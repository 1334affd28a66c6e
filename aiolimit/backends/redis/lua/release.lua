-- release: hands permits back before their grants expire. Safe to run twice: a client
-- library that sends the call again (after a timeout, say) releases nothing more.
--
-- KEYS[1] config hash
-- KEYS[2] value key      (the client's own for PER_CLIENT)
-- KEYS[3] permits ZSET   (the client's own for PER_CLIENT)
-- KEYS[4] the limiter's receipts: ZSET "<tag>:released", one member per release to remember,
--         scored by the time (us) after which it is forgotten
-- ARGV[1] permits to hand back
-- ARGV[2] now in microseconds, or '' to read the server's TIME
-- ARGV[3] rate type the caller built KEYS for
-- ARGV[4] the member of one grant to hand back (Grant.member: a cancelled caller's, even a
--         reservation), or '' to take from the most recent grants that have started; a
--         member of another life than the config's (lib.lua) hands back nothing
-- ARGV[5] this release's receipt: "<member>[ <client id>]" for a grant, a fresh id otherwise
-- ARGV[6] who releases ("<process>:<client id>"), or ''/absent: permits released are told on
--         the limiter's refund channel T:refunded, as settle.lua does
--
-- A grant gives back only what it still holds against the limit (see each algorithm's
-- `release`). A sliding window's grant handed back is gone from its log, so a second hand-back
-- finds nothing; for the other algorithms, and for a release that names no grant, the receipt
-- is remembered: while a grant could still give anything back (one longest interval from its
-- start), or RECEIPT_US (_protocol.py) for the others. One key per limiter, whatever the rate
-- of releases; it outlives a deleted limiter, so a late resend cannot release a recreated
-- one's permits. At most WALK_STEPS grants are handed back per call.
-- Returns {0, released}, {-1} without config, {-3, type} for the other rate type.

local RECEIPT_US = 60000000

local config, trouble = budget_config(KEYS[1], ARGV[3])
if not config then
  return trouble
end
local now = limiter_now(config, ARGV[2])
local member = ARGV[4] ~= '' and ARGV[4] or nil
if member then
  local life
  member, life = split_life(member)
  if life ~= config.life then
    return { 0, 0 } -- a grant of another life (see settle.lua): nothing of this one's is its
  end
end
local group = load_group(config, KEYS[2], KEYS[3], true)
local receipts, receipt = KEYS[4], nil
if not (member and group.algorithm.idempotent) then
  receipt = ARGV[5]
  redis.call('ZREMRANGEBYSCORE', receipts, '-inf', fmt(now))
  if redis.call('ZSCORE', receipts, receipt) then
    return { 0, 0 } -- sent again: it was handed back already
  end
end
save_clock(config)
group.algorithm.reclaim(group, now, true)
local released = group.algorithm.release(group, tonumber(ARGV[1]), member, now)
group.algorithm.save(group, now)
if released > 0 and ARGV[6] and ARGV[6] ~= '' then
  redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -7) .. 'refunded', fmt(released) .. ' ' .. ARGV[6])
end
if receipt then
  local until_ = now + RECEIPT_US
  if member then
    local _, start = parse_grant(member)
    until_ = start + config.longest
  end
  if until_ > now then
    redis.call('ZADD', receipts, fmt(until_), receipt)
    if redis.call('PTTL', receipts) < ms(until_ - now) then
      redis.call('PEXPIRE', receipts, ms(until_ - now))
    end
  end
end
return { 0, released }
