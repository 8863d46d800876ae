-- Cancel a job on behalf of its owner. A waiting job ends `cancelled` at once; a running one is flagged and
-- announced on CANCELS: the worker's listener hears it at once and the generation loop stops at its next
-- token (the flag is the fallback: every output write returns it). Returns the status it found, or
-- 'not_found' (also for another owner's job), or 'cancelling'.
-- ARG: id, owner, result_ttl_s, error_json ('' for a plain cancel; the job's error otherwise)
local id, owner, result_ttl, err = ARG.id, ARG.owner, tonumber(ARG.result_ttl_s), ARG.error
local jkey = JOB .. id
local f = redis.call('HMGET', jkey, 'status', 'owner')
if not f[1] or f[2] ~= owner then return 'not_found' end
if f[1] == 'queued' then
  drop(id, 'cancelled', 'cancelled', err, result_ttl, now())
  return 'queued'
elseif f[1] == 'in_progress' then
  -- remember how far generation had got when asked, so "stops within a step" can be checked
  redis.call('HSET', jkey, 'cancel_requested', redis.call('HGET', jkey, 'completion_tokens') or '0')
  if err ~= '' then redis.call('HSET', jkey, 'cancel_error', err) end
  redis.call('PUBLISH', CANCELS, id)
  return 'cancelling'
end
return f[1]
