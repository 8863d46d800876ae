-- Claim the next job in fair order for this worker, atomically. Jobs at the head of the queue that must not run
-- are ended on the way, without a token: past its deadline (by Redis's clock) `expired`; watched, with its
-- watcher's lease lapsed, `cancelled` (client_gone). Only the worker holding the device's lease may claim.
-- ARGV: result_ttl_s, run_life_s, device, worker_id  ->  {id, the job's fields as HGETALL gives them}, or false
-- ('lost' without the lease)
local result_ttl, run_life, device, worker = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), ARGV[A + 3], ARGV[A + 4]
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
  else
    return {id, start(id, f[4], f[5], worker, device, run_life, t)}
  end
end
return false
