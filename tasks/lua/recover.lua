-- Release one running job for its own worker, which could not record the job's outcome (Redis was away):
-- requeued at the front, or failed after max_attempts (see release() in common.lua). The periodic sweep
-- of orphaned jobs is in housekeep.lua.
-- ARGV: max_attempts, ttl_s, result_ttl_s, job_id, worker_id  ->  {id, verdict} or {}
local max_attempts, ttl, result_ttl = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3])
local id, worker = ARGV[A + 4], ARGV[A + 5]
if redis.call('HGET', JOB .. id, 'worker') ~= worker then return {} end
return {id, release(id, max_attempts, ttl, result_ttl, 'worker_crashed')}
