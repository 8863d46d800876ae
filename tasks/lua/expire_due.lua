-- End every waiting job whose deadline has passed (by Redis's clock) as `expired`.
-- ARGV: result_ttl_s, limit  ->  number expired
local result_ttl, limit = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2])
local t = now()
local due = redis.call('ZRANGEBYSCORE', WAITING, '-inf', fmt(t), 'LIMIT', 0, limit)
for _, id in ipairs(due) do expire_waiting(id, result_ttl, t) end
return #due
