-- The image bytes Redis keeps (tasks/store/images.py says why and how long), shared by every script: admission
-- keeps a job's images as it admits it (admit.lua: never before, so a refusal leaves none), and a job's end lets
-- them go (finish in common.lua), unless another live job of the owner, or a follow-up, still needs them.
-- An owner holds an image while one of their jobs holding it may wait and run (`live` of them, each for at most
-- ttl + the job time limit from its admission), and after one completed, `keep` seconds more (for a follow-up
-- that resends it from the server's record, and the job's page). The image lives while an owner holds it.
--   IMAGE .. d         the bytes of image d (its SHA-256), living as long as its last owner's hold
--   IMAGE_OWNERS .. d  sorted set: owner -> until when they hold d (the same life)
--   USER_IMAGES .. o   sorted set: digest -> until when owner o holds it
--   USER_IMAGE_INFO .. o  hash: digest -> 'size live kept' (its bytes, o's live jobs holding it, until when o keeps
--                      it for a follow-up), and 'bytes': the sum of the sizes o holds (what ONELANE_IMAGE_USER_BYTES
--                      bounds); both of o's keys live as long as o's last hold
--   IMAGES             sorted set: 'digest size' -> until when the image lives; IMAGE_BYTES: the sum of their
--                      sizes (what ONELANE_IMAGE_TOTAL_BYTES bounds); both live as long as the last image
-- Holds that lapse with time (nothing ends then) are dropped by the next admission of an image (image_prune).

local function image_life(key, t, until_)
  local life = math.max(1, math.ceil(until_ - t))
  if redis.call('TTL', key) < life then redis.call('EXPIRE', key, life) end
end

-- Image bytes no longer kept (the count of every image's bytes goes with the last of them)
local function image_bytes_less(size)
  if redis.call('DECRBY', IMAGE_BYTES, size) <= 0 then redis.call('DEL', IMAGE_BYTES) end
end

-- What owner `o` knows of image `d`: its size, o's live jobs holding it, until when o keeps it after them (nil: none)
local function image_info(o, d)
  local v = redis.call('HGET', USER_IMAGE_INFO .. o, d)
  if not v then return nil end
  local size, live, kept = string.match(v, '^(%d+) (%d+) ([%d.]+)$')
  return tonumber(size), tonumber(live), tonumber(kept)
end

-- Image d's life: as long as its last owner's hold; gone with the last of them
local function image_settle(d, size, t)
  redis.call('ZREMRANGEBYSCORE', IMAGE_OWNERS .. d, '-inf', '(' .. t)
  local top = redis.call('ZREVRANGE', IMAGE_OWNERS .. d, 0, 0, 'WITHSCORES')
  local member = d .. ' ' .. size
  if #top == 0 then
    redis.call('DEL', IMAGE .. d, IMAGE_OWNERS .. d)
    if redis.call('ZREM', IMAGES, member) == 1 then image_bytes_less(size) end
    return
  end
  local until_ = tonumber(top[2])
  local life = math.max(1, math.ceil(until_ - t))
  redis.call('EXPIRE', IMAGE .. d, life)
  redis.call('EXPIRE', IMAGE_OWNERS .. d, life)
  if redis.call('ZADD', IMAGES, until_, member) == 1 then redis.call('INCRBY', IMAGE_BYTES, size) end
  image_life(IMAGES, t, until_)
  image_life(IMAGE_BYTES, t, until_)
end

-- Owner o holds image d until `until_` (`live` of their jobs holding it, kept until `kept` after them)
local function image_hold(o, d, size, live, kept, until_, t)
  local info = USER_IMAGE_INFO .. o
  if redis.call('HEXISTS', info, d) == 0 then redis.call('HINCRBY', info, 'bytes', size) end
  redis.call('HSET', info, d, size .. ' ' .. live .. ' ' .. string.format('%.3f', kept))
  redis.call('ZADD', USER_IMAGES .. o, until_, d)
  redis.call('ZADD', IMAGE_OWNERS .. d, until_, o)
  image_life(info, t, until_)
  image_life(USER_IMAGES .. o, t, until_)
  image_settle(d, size, t)
end

-- Owner o holds image d no longer
local function image_release(o, d, t)
  local info = USER_IMAGE_INFO .. o
  local size = image_info(o, d)
  redis.call('ZREM', USER_IMAGES .. o, d)
  redis.call('ZREM', IMAGE_OWNERS .. d, o)
  if not size then return end
  redis.call('HDEL', info, d)
  if redis.call('HINCRBY', info, 'bytes', -size) <= 0 then redis.call('HDEL', info, 'bytes') end
  image_settle(d, size, t)
end

-- Drop the holds that lapsed: every image's whose last hold did, and owner o's
local function image_prune(o, t)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', IMAGES, '-inf', '(' .. t)) do
    local d, size = string.match(member, '^(%x+) (%d+)$')
    redis.call('ZREM', IMAGES, member)
    image_bytes_less(size)
    redis.call('DEL', IMAGE .. d, IMAGE_OWNERS .. d)
  end
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', USER_IMAGES .. o, '-inf', '(' .. t)) do image_release(o, d, t) end
end

-- A job ended (`status`): its owner's hold of each of its images goes, unless another of their live jobs holds it,
-- or the job completed and its images are kept for a follow-up (the job's `image_keep` seconds)
local function images_end(id, status, t)
  local f = redis.call('HMGET', JOB .. id, 'owner', 'images', 'image_keep')
  if not f[1] or not f[2] then return end
  local keep = tonumber(f[3]) or 0
  for d in string.gmatch(f[2], '%x+') do
    local size, live, kept = image_info(f[1], d)
    if size then
      live = math.max(0, live - 1)
      if status == 'completed' and keep > 0 then kept = math.max(kept, t + keep) end
      if live > 0 then -- (its other jobs need it as long as its hold says)
        redis.call('HSET', USER_IMAGE_INFO .. f[1], d, size .. ' ' .. live .. ' ' .. string.format('%.3f', kept))
      elseif kept > t then
        image_hold(f[1], d, size, 0, kept, kept, t)
      else
        image_release(f[1], d, t)
      end
    end
  end
end
