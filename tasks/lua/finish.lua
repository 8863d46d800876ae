-- End a running job. Only an `in_progress` job, run by this worker, can end here: a job has exactly one
-- terminal state, and a worker presumed dead (its job requeued) cannot end it. A job ends `cancelled` only if
-- someone asked (cancel.lua): a worker that merely lost track of it (say, Redis was away) must not invent that.
-- Ending it again as it ended is harmless (a retried write whose first reply was lost).
-- ARG: id, status, finish_reason, error_json, prompt_tokens, completion_tokens, result_ttl_s, worker_id,
--       stop_seen_at (tokens generated when the worker heard it must stop; '' if it did not), cached_tokens,
--       history ('' or, when the worker's prefix cache kept a chat's KV state: the digest of the conversation it
--       holds, its messages then its answer, as history_digest in tasks/job.py names it), stop_sequence (the stop
--       string it ended at, or ''), proposed_tokens and accepted_tokens (of its last run: tokens its steps checked
--       as proposed, and kept; worker/batch/speculation.py)
-- That history is recorded against the job's device, so that its follow-up (which resends it) is steered there.
-- -> FINISHED_ENDED (now or before, so), FINISHED_NOT_HERE if it was not running here, FINISHED_NOT_ASKED if it
--    says `cancelled` and nobody asked to cancel it
local id, status, reason, err = ARG.id, ARG.status, ARG.finish_reason, ARG.error
local prompt_tokens, completion_tokens = ARG.prompt_tokens, ARG.completion_tokens
local result_ttl = tonumber(ARG.result_ttl_s)
local jkey = JOB .. id
local f = redis.call('HMGET', jkey, 'status', 'worker', 'cancel_requested')
if f[1] == status and f[2] == ARG.worker then return FINISHED_ENDED end
if f[1] ~= 'in_progress' or f[2] ~= ARG.worker then return FINISHED_NOT_HERE end
if status == 'cancelled' and not f[3] then return FINISHED_NOT_ASKED end
if status == 'cancelled' and err == '' then err = redis.call('HGET', jkey, 'cancel_error') or '' end
local t = now()
redis.call('HSET', jkey, 'prompt_tokens', prompt_tokens, 'completion_tokens', completion_tokens,
  'cached_tokens', ARG.cached_tokens or 0, 'proposed_tokens', ARG.proposed_tokens or 0,
  'accepted_tokens', ARG.accepted_tokens or 0)
if ARG.stop_seen_at ~= '' then redis.call('HSET', jkey, 'stop_seen_at', ARG.stop_seen_at) end
if ARG.stop_sequence ~= '' and status == 'completed' then redis.call('HSET', jkey, 'stop_sequence', ARG.stop_sequence) end
local started = tonumber(redis.call('HGET', jkey, 'started_at'))
if started then observe('job_duration', t - started) end
local j = redis.call('HMGET', jkey, 'model', 'max_tokens', 'ignore_eos', 'prompt_chars')
local model = j[1]
if model then -- per model, for /metrics
  stat('model_tokens:' .. model, tonumber(completion_tokens))
  stat('model_proposed:' .. model, tonumber(ARG.proposed_tokens) or 0)
  stat('model_accepted:' .. model, tonumber(ARG.accepted_tokens) or 0)
  stat('model_finished:' .. model .. ':' .. status)
end
if model and status == 'completed' then -- how long answers of this model are, for ETAs
  local how = j[3] == '1' and 'i' or reason == 'length' and 'l' or 's'
  local lengths = LENGTHS .. model
  redis.call('LPUSH', lengths, table.concat({completion_tokens, j[2] or '0', how, j[4] or '0', prompt_tokens}, ','))
  redis.call('LTRIM', lengths, 0, LENGTHS_KEPT - 1)
  redis.call('EXPIRE', lengths, MODEL_RECORD_TTL)
end
if ARG.history ~= '' then
  redis.call('SET', AFFINITY .. ARG.history, redis.call('HGET', jkey, 'device'), 'EX', result_ttl)
end
finish(id, status, reason, err, result_ttl, t)
return FINISHED_ENDED
