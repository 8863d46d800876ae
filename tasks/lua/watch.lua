-- A watched job's client is still there (its stream, or its polling): renew its watcher's lease for the grace it
-- was admitted with. Only a job that still waits has one. ARG: id
local id = ARG.id
local grace = tonumber(redis.call('HGET', JOB .. id, 'watched') or '')
if grace then redis.call('ZADD', WATCHED, 'XX', now() + grace, id) end
return 0
