-- Admit a job: create its record and put it at the tail of its owner's queue.
-- A watched job gets a lease of `watch_grace_s` (0: not watched) that its client's stream or polling renews.
-- ARGV: id, owner, spec_json, ttl_s, result_ttl_s, watch_grace_s  ->  {queued_at, deadline}
local id, owner, spec = ARGV[A + 1], ARGV[A + 2], ARGV[A + 3]
local ttl, result_ttl, grace = tonumber(ARGV[A + 4]), tonumber(ARGV[A + 5]), tonumber(ARGV[A + 6])
local t = now()
local deadline = t + ttl
local life = math.ceil(ttl + result_ttl)
local jkey = JOB .. id
redis.call('HSET', jkey, 'spec', spec, 'owner', owner, 'status', 'queued', 'queued_at', fmt(t),
  'deadline', fmt(deadline), 'attempts', 0, 'prompt_tokens', 0, 'completion_tokens', 0)
redis.call('EXPIRE', jkey, life)
if grace > 0 then
  redis.call('HSET', jkey, 'watched', '1')
  redis.call('SET', WATCH .. id, '1', 'PX', math.ceil(grace * 1000))
end
local q = UQ .. owner
if redis.call('ZCARD', q) == 0 then redis.call('RPUSH', RING, owner) end
redis.call('ZADD', q, t, id)
redis.call('ZADD', WAITING, deadline, id)
redis.call('ZADD', UJ .. owner, t, id)
redis.call('ZREMRANGEBYRANK', UJ .. owner, 0, -1001) -- a user's listing keeps the newest 1000
for _, k in ipairs({q, RING, WAITING, UJ .. owner}) do extend(k, life) end
redis.call('PUBLISH', MOVED, id)
return {fmt(t), fmt(deadline)}
