"""The Lua scripts the sync runs on Valkey/Redis, and the key names they touch.

Every key of one bucket carries the bucket's hash tag, `{<prefix>:b<n>}`, so on a Valkey Cluster
one sync of a bucket is one script call on one node. Per bucket:

- `{p:bN}:c:<sample>`: a HASH, field "<entity>\\x1e<replica>" = that replica's absolute bytes in
  the aligned sample. Absolute, so a retried write never counts twice.
- `{p:bN}:t:<sample>`: a HASH, field "<entity>" = the sum over replicas, kept by the script
  (HINCRBY by the change of a replica's absolute value).
- `{p:bN}:r`: a HASH of the replicas that wrote to the bucket: a replica that wrote before and
  finds itself missing knows the store lost its writes, and writes everything retained again.

Every key expires (PEXPIRE) two windows after the last sample it could count in: dead replicas'
numbers leave with their samples.

- `{p:bN}:q:<entity>`: a HASH, the queue of the replicas waiting for a turn on a paced quota:
  field "<replica>" = "<order> <server ms last claimed>" (quota/turns.py); `{p:bN}:qn` numbers
  the claims.

Outside the buckets: `{p}:replicas`, a sorted set of replica heartbeats (score: the server's
time in ms), and `{p}:quotas` / `{p}:quotas:v`, the quotas set through the API and their version.
"""

from __future__ import annotations

SEP_REPLICA = "\x1e"

# KEYS[1] = the bucket's replica set; then per sample: KEYS[2i] contributions, KEYS[2i+1] totals.
# ARGV: replica, ttl_ms, n_samples, wrote_before (0/1), n_writes, (sample_pos, entity, value)*,
#       n_reads, (entity, n, sample_pos*)*
# Returns: {lost (0/1), totals...} with one total per (read entity, sample) in the order asked.
SYNC_BUCKET = """
local replica = ARGV[1]
local ttl = tonumber(ARGV[2])
local n_samples = tonumber(ARGV[3])
local CHUNK = 1000
local lost = 0
if ARGV[4] == '1' and redis.call('HEXISTS', KEYS[1], replica) == 0 then
  lost = 1
end
redis.call('HSET', KEYS[1], replica, '1')
redis.call('PEXPIRE', KEYS[1], ttl)
-- The writes, grouped by sample: their old values in one HMGET and the new ones in one HSET per
-- sample (in chunks: unpack() takes a few thousand values at most), then one HINCRBY for each
-- value that changed, whose answer is that total (kept in `fresh`, not read again below).
local by_pos = {}
local fresh = {}
local i = 6
local n_writes = tonumber(ARGV[5])
for _ = 1, n_writes do
  local pos = tonumber(ARGV[i])
  local group = by_pos[pos]
  if group == nil then
    group = {}
    by_pos[pos] = group
  end
  group[#group + 1] = i
  i = i + 3
end
for pos, group in pairs(by_pos) do
  local ckey, tkey = KEYS[2 * pos], KEYS[2 * pos + 1]
  local touched = false
  local known = {}
  fresh[pos] = known
  for first = 1, #group, CHUNK do
    local last = math.min(first + CHUNK - 1, #group)
    local fields = {}
    for k = first, last do
      fields[#fields + 1] = ARGV[group[k] + 1] .. '\\30' .. replica
    end
    local olds = redis.call('HMGET', ckey, unpack(fields))
    local news = {}
    for k = first, last do
      local at = group[k]
      local value = tonumber(ARGV[at + 2])
      local old = tonumber(olds[k - first + 1] or '0')
      if value ~= old then
        news[#news + 1] = fields[k - first + 1]
        news[#news + 1] = ARGV[at + 2]
        known[ARGV[at + 1]] = redis.call('HINCRBY', tkey, ARGV[at + 1], value - old)
      end
    end
    if #news > 0 then
      redis.call('HSET', ckey, unpack(news))
      touched = true
    end
  end
  if touched then
    redis.call('PEXPIRE', ckey, ttl)
    redis.call('PEXPIRE', tkey, ttl)
  end
end
-- The reads, grouped by sample the same way: one HMGET per sample (and chunk) for the totals not
-- just answered by HINCRBY, answered in the order asked.
local out = {lost}
local n_reads = tonumber(ARGV[i])
i = i + 1
local wanted = {}
for _ = 1, n_reads do
  local entity = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  i = i + 2
  for _ = 1, n do
    local pos = tonumber(ARGV[i])
    i = i + 1
    local slot = #out + 1
    local known = fresh[pos]
    local total = known and known[entity]
    if total then
      out[slot] = total
    else
      out[slot] = 0
      local group = wanted[pos]
      if group == nil then
        group = {}
        wanted[pos] = group
      end
      group[#group + 1] = slot
      group[#group + 1] = entity
    end
  end
end
for pos, group in pairs(wanted) do
  local tkey = KEYS[2 * pos + 1]
  for first = 1, #group, 2 * CHUNK do
    local last = math.min(first + 2 * CHUNK - 1, #group)
    local entities = {}
    for k = first + 1, last, 2 do
      entities[#entities + 1] = group[k]
    end
    local got = redis.call('HMGET', tkey, unpack(entities))
    for j = 1, #got do
      out[group[first + 2 * (j - 1)]] = tonumber(got[j] or '0')
    end
  end
end
return out
"""

# KEYS[1] = the heartbeat set. ARGV: replica, the age in ms after which a replica is gone.
# Returns {server time in ms, live replicas}.
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
return {now, redis.call('ZCARD', KEYS[1])}
"""

# The paced quotas' turns (quota/turns.py). KEYS[1] = the bucket's counter of claims; then one
# queue per entity, a HASH: field <replica> = "<order> <server ms last claimed>". ARGV: replica,
# stale_ms (a claim not renewed for this long is a dead replica's: dropped), ttl_ms, then per
# queue its mode: 0 give the claim up, 1 give it up and claim anew (at the back), 2 claim or
# renew. Returns, per queue claimed (modes 1 and 2, in order): whether this replica's claim heads
# it (1/0), and whether another replica's is in it too (1/0).
TAKE_TURNS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local replica = ARGV[1]
local stale = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local out = {}
for k = 2, #KEYS do
  local queue = KEYS[k]
  local mode = ARGV[k + 2]
  if mode ~= '2' then
    redis.call('HDEL', queue, replica)
  end
  if mode ~= '0' then
    local mine = redis.call('HGET', queue, replica)
    local order
    if mine then
      order = string.match(mine, '^(%d+)')
    else
      order = redis.call('INCR', KEYS[1])
    end
    redis.call('HSET', queue, replica, order .. ' ' .. now)
    redis.call('PEXPIRE', queue, ttl)
    local all = redis.call('HGETALL', queue)
    local head, head_order, n = nil, nil, 0
    for j = 1, #all, 2 do
      local o, at = string.match(all[j + 1], '^(%d+) (%d+)$')
      o = tonumber(o)
      if now - tonumber(at) > stale then
        redis.call('HDEL', queue, all[j])
      else
        n = n + 1
        if head_order == nil or o < head_order then
          head, head_order = all[j], o
        end
      end
    end
    out[#out + 1] = (head == replica) and 1 or 0
    out[#out + 1] = (n > 1) and 1 or 0
  end
end
return out
"""

# KEYS[1] = the quotas HASH, KEYS[2] = its version. ARGV: (field, value-or-empty)*, where an
# empty value is a removal (kept as a tombstone: "" wins over the replicas' YAML files).
SET_QUOTAS = """
for i = 1, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return redis.call('INCR', KEYS[2])
"""


def bucket_tag(prefix: str, bucket: int, kind: str = "b") -> str:
    """`kind`: "b" for the byte rates and mutations, "p" for producer-id rates (their windows
    differ), "i" for the producer ids themselves."""
    return f"{{{prefix}:{kind}{bucket}}}"


def bucket_keys(prefix: str, bucket: int, samples: list[int], kind: str = "b") -> list[str]:
    tag = bucket_tag(prefix, bucket, kind)
    keys = [f"{tag}:r"]
    for s in samples:
        keys.append(f"{tag}:c:{s}")
        keys.append(f"{tag}:t:{s}")
    return keys


def turn_keys(prefix: str, bucket: int, entities: list[str]) -> list[str]:
    """`TAKE_TURNS`' keys: the bucket's counter of claims, then each entity's queue."""
    tag = bucket_tag(prefix, bucket, "b")
    return [f"{tag}:qn", *(f"{tag}:q:{e}" for e in entities)]


# KEYS: per (user, window) group, its window's set and the window before's. ARGV: ttl_ms, then
# per group: n, id*. Returns one flag per id: 1 if no replica had counted it in either window.
SEEN_IDS = """
local ttl = tonumber(ARGV[1])
local out = {}
local i = 2
local k = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  i = i + 1
  local cur, prev = KEYS[k], KEYS[k + 1]
  k = k + 2
  for _ = 1, n do
    local fresh = redis.call('SADD', cur, ARGV[i])
    if fresh == 1 and redis.call('SISMEMBER', prev, ARGV[i]) == 1 then
      fresh = 0
    end
    out[#out + 1] = fresh
    i = i + 1
  end
  redis.call('PEXPIRE', cur, ttl)
end
return out
"""


def id_set_keys(prefix: str, bucket: int, user: str, window: int) -> list[str]:
    tag = bucket_tag(prefix, bucket, "i")
    return [f"{tag}:{window}:{user}", f"{tag}:{window - 1}:{user}"]


def heartbeat_key(prefix: str) -> str:
    return f"{{{prefix}}}:replicas"


def quota_keys(prefix: str) -> list[str]:
    return [f"{{{prefix}}}:quotas", f"{{{prefix}}}:quotas:v"]
