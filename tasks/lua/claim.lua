-- Claim the next job to run: the lowest score in QUEUE (fair order, see admit.lua). Only a `queued` job whose
-- deadline has not passed (by Redis's clock) becomes `in_progress`; one past its deadline ends `expired`;
-- a watched job whose client left (its lease lapsed) ends `cancelled` (client_gone); anything else popped
-- (cancelled, vanished) is dropped. Only the worker holding the device's lease may claim.
-- ARGV: result_ttl_s, run_life_s, device, worker_id  ->  {id, the job's fields as HGETALL gives them}, or false
-- ('lost' without the lease)
local result_ttl, run_life, device, worker = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), ARGV[A + 3], ARGV[A + 4]
if redis.call('HGET', DEVICE .. device, 'worker') ~= worker then return 'lost' end
local t = now()
for _ = 1, 1000 do
  local popped = redis.call('ZPOPMIN', QUEUE)
  if #popped == 0 then return false end
  local id = popped[1]
  local jkey = JOB .. id
  local f = redis.call('HMGET', jkey, 'status', 'deadline', 'watched', 'owner', 'tag', 'queued_at')
  redis.call('ZREM', WAITING, id)
  if f[4] then redis.call('ZREM', UQ .. f[4], id) end
  redis.call('PUBLISH', MOVED, id)
  if f[1] == 'queued' then
    if t >= tonumber(f[2]) then
      finish(id, 'expired', '', error_json('expired', 'the job waited past its deadline and was never started'),
        result_ttl, t)
    elseif f[3] == '1' and redis.call('EXISTS', WATCH .. id) == 0 then
      finish(id, 'cancelled', 'cancelled', error_json('client_gone', 'the client left before the job started'),
        result_ttl, t)
    else
      redis.call('SET', VTIME, f[5], 'KEEPTTL')
      extend(VTIME, run_life)
      redis.call('HSET', jkey, 'status', 'in_progress', 'started_at', fmt(t), 'worker', worker, 'device', device)
      local attempt = redis.call('HINCRBY', jkey, 'attempts', 1)
      redis.call('EXPIRE', jkey, run_life)
      redis.call('ZADD', IN_PROGRESS, t, id)
      extend(IN_PROGRESS, run_life)
      redis.call('HSET', DEVICE .. device, 'job', id)
      if attempt == 1 then observe('queue_wait', t - tonumber(f[6])) end
      emit(id, '{"type":"started"}')
      return {id, redis.call('HGETALL', jkey)}
    end
  end
end
return false
