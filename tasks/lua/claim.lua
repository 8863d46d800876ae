-- Claim the next job in fair order for this worker, atomically. Jobs at the head of the queue that must not run
-- are ended on the way, without a token: past its deadline (by Redis's clock) `expired`; watched, with its
-- watcher's lease lapsed, `cancelled` (client_gone). Only the worker holding the device's lease may claim.
-- A worker with a KV budget must know a job's size before it starts it, so the head is started only if it is the
-- job the worker names (`want`, which it measured, or '*': any job, as into an empty batch); any other head is
-- returned as it is, unclaimed.
-- ARGV: result_ttl_s, run_life_s, device, worker_id, want ('' for none)
-- -> {'started' | 'head', id, the job's fields as HGETALL gives them, jobs still waiting after it}, or false when
-- nothing waits, or 'lost' without the lease
local result_ttl, run_life, device, worker = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), ARGV[A + 3], ARGV[A + 4]
local want = ARGV[A + 5]
if redis.call('HGET', DEVICE .. device, 'worker') ~= worker then return 'lost' end
local t = now()
for _ = 1, 1000 do
  local id = redis.call('ZRANGE', QUEUE, 0, 0)[1]
  if not id then return false end
  local f = redis.call('HMGET', JOB .. id, 'status', 'deadline', 'watched', 'owner', 'tag')
  if f[1] ~= 'queued' then
    dequeue(id, f[4]) -- a stray entry: the job ended, or its record is gone
  elseif t >= tonumber(f[2]) then
    drop(id, f[4], 'expired', '', error_json('expired', EXPIRED), result_ttl, t)
  elseif f[3] and tonumber(redis.call('ZSCORE', WATCHED, id) or '0') <= t then
    drop(id, f[4], 'cancelled', 'cancelled', error_json('client_gone', CLIENT_GONE), result_ttl, t)
  elseif id == want or want == '*' then
    local fields = start(id, f[4], f[5], worker, device, run_life, t)
    return {'started', id, fields, redis.call('ZCARD', QUEUE)}
  else
    return {'head', id, redis.call('HGETALL', JOB .. id), redis.call('ZCARD', QUEUE) - 1}
  end
end
return false
