-- Write a model's record (its load begun, ended, or the model put away) for the worker that holds the device, and
-- for no other: a worker whose lease lapsed while it loaded (a starved machine) may finish that load after the next
-- worker began the same one. Its `loaded` would hide the next load, so a death there would not be counted by
-- failed_models.lua (which looks for a record still `loading`), and it would name a worker that serves nothing; it
-- stops at its next renewal anyway.
-- ARG: model, device, worker, *fields (name, value, ...)  ->  1 written, 0 not (the device is not this worker's)
if redis.call('HGET', DEVICE .. ARG.device, 'worker') ~= ARG.worker then return 0 end
local key = MODEL .. ARG.model
redis.call('HSET', key, 'worker', ARG.worker, unpack(ARG.fields))
redis.call('EXPIRE', key, MODEL_RECORD_TTL)
return 1
