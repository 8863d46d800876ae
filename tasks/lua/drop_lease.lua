-- Free a device whose worker process is known to be dead (its supervisor reaped it), so a standby can take
-- it at once instead of waiting for the lease to lapse. ARGV: device, pid  ->  1 if dropped
local key = DEVICE .. ARGV[A + 1]
if redis.call('HGET', key, 'pid') == ARGV[A + 2] then return redis.call('DEL', key) end
return 0
