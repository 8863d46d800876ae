-- A stream opened on a job that was admitted without one (GET /jobs/{id}/events, a response streamed later): its
-- client reads the answer as it is generated, so the worker writes its tokens the moment they come, not in quiet
-- windows (worker/output.py). Recorded on the job for a worker that claims it later; a worker running it is told at
-- once. ARG: id  ->  1 if the job is now followed live, 0 if it was already (or has ended, or is not there)
local jkey = JOB .. ARG.id
local f = redis.call('HMGET', jkey, 'status', 'live')
if f[2] or (f[1] ~= 'queued' and f[1] ~= 'in_progress') then return 0 end
redis.call('HSET', jkey, 'live', '1')
if f[1] == 'in_progress' then redis.call('PUBLISH', LIVE, ARG.id) end
return 1
