-- Find running jobs whose worker no longer holds their device's lease (it died, or froze past its lease)
-- and release them (see release() in common.lua). Also releases one job by id for its own worker, when
-- that worker could not record the job's outcome.
-- ARGV: max_attempts, ttl_s, result_ttl_s, job_id ('' to sweep), worker_id  ->  {id, verdict, ...}
local max_attempts, ttl, result_ttl = tonumber(ARGV[A + 1]), tonumber(ARGV[A + 2]), tonumber(ARGV[A + 3])
local only, worker = ARGV[A + 4], ARGV[A + 5]
local out = {}
local ids = redis.call('ZRANGE', IN_PROGRESS, 0, -1)
if only ~= '' then ids = {only} end
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', JOB .. id, 'worker', 'device')
  local holder = f[2] and redis.call('HGET', DEVICE .. f[2], 'worker')
  local orphan = (only == '' and holder ~= f[1]) or (only ~= '' and f[1] == worker)
  if orphan or not f[1] then
    table.insert(out, id)
    table.insert(out, release(id, max_attempts, ttl, result_ttl, 'worker_crashed'))
  end
end
return out
