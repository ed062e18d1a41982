"""The shape of the shared quota store's sync, as the store benchmarks drive it: one script call
per bucket of entities per sync, applying one replica's absolute contributions to one aligned
sample and returning the sample's totals.

Per bucket and sample, two HASHes share the bucket's hash tag, so one call touches one Cluster
slot: the contributions ("<entity>|<replica>" -> the replica's absolute bytes in the sample)
and the totals ("<entity>" -> the sum over replicas), kept equal to the contributions' sum by
HINCRBY(new - old). Writing absolute values makes a retried sync a no-op, and PEXPIRE lets the
sample vanish once no replica writes it (a dead replica's bytes go with it).

This is the benchmarks' copy of the shape, not the proxy's script (kafka_quota_proxy.proxy.store).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# KEYS[1]: contributions HASH, KEYS[2]: totals HASH, of one bucket's sample.
# ARGV: replica, ttl_ms, n, then n pairs (entity, absolute bytes), then entities only read.
# Returns the totals of the n entities written, then of the entities read, in order.
SYNC_SCRIPT = """
local contrib, totals = KEYS[1], KEYS[2]
local replica, ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 0, n - 1 do
  local entity = ARGV[4 + 2 * i]
  local value = tonumber(ARGV[5 + 2 * i])
  local field = entity .. '|' .. replica
  local old = tonumber(redis.call('HGET', contrib, field) or '0')
  if value ~= old then
    redis.call('HSET', contrib, field, value)
    out[#out + 1] = redis.call('HINCRBY', totals, entity, value - old)
  else
    out[#out + 1] = tonumber(redis.call('HGET', totals, entity) or '0')
  end
end
for i = 4 + 2 * n, #ARGV do
  out[#out + 1] = tonumber(redis.call('HGET', totals, ARGV[i]) or '0')
end
redis.call('PEXPIRE', contrib, ttl)
redis.call('PEXPIRE', totals, ttl)
return out
"""

# The same contract with fewer calls into the server: the old values come in one HMGET and the new
# ones go in one HSET (in chunks: Lua's unpack() takes at most ~8,000 values), so an entity costs
# one HINCRBY when its value changed, and the unchanged ones' totals come in one HMGET.
SYNC_SCRIPT_BATCHED = """
local contrib, totals = KEYS[1], KEYS[2]
local replica, ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local CHUNK = 1000
local out, fields, olds, unchanged = {}, {}, {}, {}
for i = 1, n do fields[i] = ARGV[2 + 2 * i] .. '|' .. replica end
for first = 1, n, CHUNK do
  local last = math.min(first + CHUNK - 1, n)
  local got = redis.call('HMGET', contrib, unpack(fields, first, last))
  local pairs_ = {}
  for i = first, last do
    olds[i] = tonumber(got[i - first + 1] or '0')
    pairs_[#pairs_ + 1] = fields[i]
    pairs_[#pairs_ + 1] = ARGV[3 + 2 * i]
  end
  redis.call('HSET', contrib, unpack(pairs_))
end
for i = 1, n do
  local entity, delta = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i]) - olds[i]
  if delta ~= 0 then
    out[i] = redis.call('HINCRBY', totals, entity, delta)
  else
    unchanged[#unchanged + 1] = i
  end
end
local reads = {}
for i = 1, #unchanged do reads[i] = ARGV[2 + 2 * unchanged[i]] end
for i = 4 + 2 * n, #ARGV do reads[#reads + 1] = ARGV[i] end
for first = 1, #reads, CHUNK do
  local got = redis.call('HMGET', totals, unpack(reads, first, math.min(first + CHUNK - 1, #reads)))
  for j = 1, #got do
    local k = first + j - 1
    local value = tonumber(got[j] or '0')
    if k <= #unchanged then out[unchanged[k]] = value else out[n + k - #unchanged] = value end
  end
end
redis.call('PEXPIRE', contrib, ttl)
redis.call('PEXPIRE', totals, ttl)
return out
"""
SCRIPTS = {"per-entity": SYNC_SCRIPT, "batched": SYNC_SCRIPT_BATCHED}


def bucket_keys(prefix: str, bucket: int, sample: int) -> list[str]:
    """The two keys of one bucket's sample, under one hash tag: one Cluster slot per bucket."""
    tag = f"{{{prefix}:b{bucket}}}"
    return [f"{tag}:c:{sample}", f"{tag}:t:{sample}"]


def sync_args(replica: str, ttl_ms: int, updates: Sequence[tuple[str, int]],
              reads: Iterable[str] = ()) -> list[str | int]:
    args: list[str | int] = [replica, ttl_ms, len(updates)]
    for entity, value in updates:
        args += [entity, value]
    args += list(reads)
    return args
