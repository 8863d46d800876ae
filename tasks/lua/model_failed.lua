-- A model failed to load: record why, and fail every job of it that waits (model_unavailable), at once (see
-- fail_model in common.lua); admission refuses its new jobs until `retry_s` have passed.
-- ARG: model, message, retry_s, result_ttl_s, worker_id  ->  the number of jobs failed
redis.call('HSET', MODEL .. ARG.model, 'worker', ARG.worker)
return fail_model(ARG.model, ARG.message, tonumber(ARG.retry_s), tonumber(ARG.result_ttl_s), now())
