-- End every waiting job whose deadline has passed (by Redis's clock) as `expired`.
-- ARGV: result_ttl_s, limit  ->  number expired
local result_ttl, limit = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2])
local t = now()
local due = redis.call('ZRANGEBYSCORE', WAITING, '-inf', fmt(t), 'LIMIT', 0, limit)
for _, id in ipairs(due) do
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'status', 'owner')
  if f[1] == 'queued' then
    unqueue(id, f[2])
    finish(id, 'expired', '', error_json('expired', 'the job waited past its deadline and was never started'),
      result_ttl, t)
  else
    redis.call('ZREM', WAITING, id)
  end
end
return #due
