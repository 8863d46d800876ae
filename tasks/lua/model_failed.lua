-- A model failed to load: record why, and fail every job of it that waits (model_unavailable), at once; admission
-- refuses its new jobs until `retry_s` have passed, when the next job of it makes the worker try again.
-- ARG: model, message, retry_s, result_ttl_s, worker_id  ->  the number of jobs failed
local model, message, retry, result_ttl = ARG.model, ARG.message, tonumber(ARG.retry_s), tonumber(ARG.result_ttl_s)
local t = now()
redis.call('HSET', MODEL .. model, 'state', 'failed', 'error', message, 'retry_at', fmt(t + retry), 'at', fmt(t),
  'worker', ARG.worker)
redis.call('EXPIRE', MODEL .. model, 7 * 86400)
stat('model_load_failures')
local err = error_json('model_unavailable', message)
local n = 0
for _, id in ipairs(redis.call('ZRANGE', MQ .. model, 0, -1)) do
  if redis.call('HGET', JOB .. id, 'status') == 'queued' then
    drop(id, 'failed', '', err, result_ttl, t)
    n = n + 1
  else
    redis.call('ZREM', MQ .. model, id)
  end
end
return n
