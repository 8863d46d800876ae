-- The worker's periodic round, in one command: expire overdue waiting jobs, release running jobs whose
-- worker lost its device (see recover.lua, release() in common.lua), and count what waits.
-- ARGV: max_attempts, ttl_s, result_ttl_s, expire_limit  ->  {waiting, id, verdict, id, verdict, ...}
local max_attempts, ttl, result_ttl, limit = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3]),
  tonumber(ARGV[A + 4])
local t = now()
for _, id in ipairs(redis.call('ZRANGEBYSCORE', WAITING, '-inf', fmt(t), 'LIMIT', 0, limit)) do
  expire_waiting(id, result_ttl, t)
end
local out = {redis.call('ZCARD', QUEUE)}
for _, id in ipairs(redis.call('ZRANGE', IN_PROGRESS, 0, -1)) do
  if orphaned(id) then
    table.insert(out, id)
    table.insert(out, release(id, max_attempts, ttl, result_ttl, 'worker_crashed'))
  end
end
return out
