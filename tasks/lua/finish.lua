-- End a running job. Only an `in_progress` job can end here, so a job has exactly one terminal state.
-- ARGV: id, status, finish_reason, error_json, prompt_tokens, completion_tokens, result_ttl_s
-- -> 1 if ended, 0 if it was not running
local id, status, reason, err = ARGV[A + 1], ARGV[A + 2], ARGV[A + 3], ARGV[A + 4]
local prompt_tokens, completion_tokens, result_ttl = ARGV[A + 5], ARGV[A + 6], tonumber(ARGV[A + 7])
local jkey = JOB .. id
if redis.call('HGET', jkey, 'status') ~= 'in_progress' then return 0 end
if status == 'cancelled' and err == '' then err = redis.call('HGET', jkey, 'cancel_error') or '' end
local t = now()
redis.call('HSET', jkey, 'prompt_tokens', prompt_tokens, 'completion_tokens', completion_tokens)
local started = tonumber(redis.call('HGET', jkey, 'started_at'))
if started then
  redis.call('LPUSH', SERVICE_TIMES, fmt(t - started))
  redis.call('LTRIM', SERVICE_TIMES, 0, 19)
  redis.call('EXPIRE', SERVICE_TIMES, 86400)
end
if redis.call('HGET', RUNNING, 'id') == id then redis.call('DEL', RUNNING) end
finish(id, status, reason, err, result_ttl, t)
return 1
