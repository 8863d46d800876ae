-- Release running jobs for their own worker, which could not record their outcome (Redis was away), or whose
-- batch step failed: requeued at the front, or failed after max_attempts (see release() in common.lua). The
-- periodic sweep of orphaned jobs is in housekeep.lua.
-- ARG: max_attempts, ttl_s, result_ttl_s, job_id, worker_id, why, shared ('1': it ran with others, or '')
--   ->  {id, verdict} or {}
local max_attempts, ttl, result_ttl = tonumber(ARG.max_attempts), tonumber(ARG.ttl_s), tonumber(ARG.result_ttl_s)
local id, worker = ARG.id, ARG.worker
if redis.call('HGET', JOB .. id, 'worker') ~= worker then return {} end
return {id, release(id, max_attempts, ttl, result_ttl, ARG.why, ARG.shared == '1')}
