-- Count generated tokens, append their text as one token event (if any), and report whether the job was
-- asked to stop (cancelled, or no longer this worker's: it was presumed dead and the job requeued).
-- ARGV: id, n_tokens, text, event_json, prompt_tokens, worker_id  ->  1 to stop, 0 to go on
local id, n, text, ev, prompt_tokens = ARGV[A + 1], tonumber(ARGV[A + 2]), ARGV[A + 3], ARGV[A + 4], ARGV[A + 5]
local jkey = JOB .. id
local f = redis.call('HMGET', jkey, 'status', 'cancel_requested', 'first_token_at', 'worker', 'queued_at', 'device')
if f[1] ~= 'in_progress' or f[4] ~= ARGV[A + 6] then return 1 end
redis.call('HINCRBY', jkey, 'completion_tokens', n)
stat('tokens', n)
redis.call('HSET', jkey, 'prompt_tokens', prompt_tokens)
if n > 0 then
  local t = now()
  redis.call('HSET', jkey, 'last_token_at', fmt(t))
  if redis.call('EXISTS', DEVICE .. f[6]) == 1 then -- a lapsed lease is not recreated (without its TTL)
    redis.call('HSET', DEVICE .. f[6], 'progress', fmt(t))
  end
  per_minute(t, 'tokens', n)
  if not f[3] then
    redis.call('HSET', jkey, 'first_token_at', fmt(t))
    observe('time_to_first_token', t - tonumber(f[5]))
  end
end
if text ~= '' then
  if redis.call('APPEND', OUT .. id, text) == #text then same_life(OUT .. id, id) end
  emit(id, ev)
end
if f[2] then return 1 end
return 0
