-- Release running jobs for their own worker, which could not record their outcome (Redis was away), or whose
-- batch step failed: requeued at the front, or failed after max_attempts (see release() in common.lua). The
-- periodic sweep of orphaned jobs is in housekeep.lua.
-- ARGV: max_attempts, ttl_s, result_ttl_s, job_id, worker_id, why, shared ('1': it ran with others, or '')
--   ->  {id, verdict} or {}
local max_attempts, ttl, result_ttl = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3])
local id, worker = ARGV[A + 4], ARGV[A + 5]
if redis.call('HGET', JOB .. id, 'worker') ~= worker then return {} end
return {id, release(id, max_attempts, ttl, result_ttl, ARGV[A + 6], ARGV[A + 7] == '1')}
