"""The usage record: what the proxy logs per tenant and interval, and the pipeline reads.

One JSON object per line, one line per active (user, client-id) per interval. Version 1:

    {"v": 1,
     "start_ms": 1795257600000,   # interval start, Unix epoch ms (UTC), a multiple of the interval
     "interval_s": 10,            # interval length in seconds
     "instance": "proxy-a",       # which proxy instance wrote it
     "user": "alice",             # the principal as authenticated; "ANONYMOUS" without authentication
     "client_id": "app",          # the client-id as sent ("" when none)
     "produce_bytes": 1048576,    # Produce request bytes (Kafka's request size, as charged)
     "fetch_bytes": 0,            # Fetch response bytes delivered, size prefix excluded (as
                                  # Produce); a throttled empty response counts its own few bytes
     "requests": {"produce": 1, "fetch": 0, "metadata": 0, "group": 0, "transaction": 0,
                  "admin": 0, "other": 0},
     "request_time_ms": 0.42,     # request time as the request quota charges it (see quota_stages)
     "throttle_ms": {"produce": 0, "fetch": 0, "request": 0, "controller_mutation": 0,
                     "producer_ids": 0},
     "throttled": {"produce": 0, "fetch": 0, "request": 0, "controller_mutation": 0,
                   "producer_ids": 0},
     "new_producer_ids": 0,       # ids new for the user (counted while producer_ids_rate is set)
     "partitions_mutated": 0,     # partitions created or deleted, as KIP-599 counts them
     "connections": 0,            # connections opened by this tenant (counted at their first request)
     "quotas": {"producer_byte_rate": 1048576.0, "consumer_byte_rate": null,
                "request_percentage": null, "controller_mutation_rate": null,
                "producer_ids_rate": null}}  # the quotas in force for the tenant; null = none

Every key is always present. Throttle times are what the proxy applied (or, in observe mode,
would have). Files: `<dir>/dt=YYYY-MM-DD/hour=HH/usage-<instance>.jsonl`, one per instance and
UTC hour, gzipped to `.jsonl.gz` when the hour closes.
"""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.quota.entities import QuotaKey

VERSION = 1

# Requests are counted by group of API keys.
API_GROUPS: dict[str, frozenset[int]] = {
    "produce": frozenset({0}),
    "fetch": frozenset({1}),
    # ListOffsets, Metadata, ApiVersions, OffsetForLeaderEpoch, DescribeCluster
    "metadata": frozenset({2, 3, 18, 23, 60}),
    # OffsetCommit/Fetch, FindCoordinator, Join/Heartbeat/Leave/SyncGroup, DescribeGroups,
    # ListGroups, DeleteGroups, OffsetDelete, ConsumerGroupHeartbeat/Describe
    "group": frozenset({8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47, 68, 69}),
    # InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
    "transaction": frozenset({22, 24, 25, 26, 28}),
    # topics, configs, ACLs, partitions, reassignments, quotas, delegation tokens, ...
    "admin": frozenset({19, 20, 21, 29, 30, 31, 32, 33, 34, 35, 37, 38, 39, 40, 41, 43, 44, 45,
                        46, 48, 49, 50, 51, 57}),
}
GROUPS = (*API_GROUPS, "other")
_GROUP_OF = {key: group for group, keys in API_GROUPS.items() for key in keys}

THROTTLE_TYPES = ("produce", "fetch", "request", "controller_mutation", "producer_ids")
QUOTA_KEYS = (QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE, QuotaKey.REQUEST_PERCENTAGE,
              QuotaKey.CONTROLLER_MUTATION_RATE, QuotaKey.PRODUCER_IDS_RATE)

COUNTERS = ("produce_bytes", "fetch_bytes", "request_time_ms", "new_producer_ids", "partitions_mutated",
            "connections")


def api_group(api_key: int) -> str:
    return _GROUP_OF.get(api_key, "other")


def record(start_ms: int, interval_s: int, instance: str, user: str, client_id: str,
           counters: dict[str, float], requests: dict[str, int], throttle_ms: dict[str, int],
           throttled: dict[str, int], quotas: dict[str, float | None]) -> dict[str, Any]:
    """A complete version-1 record; missing counters and groups are 0, missing quotas null."""
    return {
        "v": VERSION,
        "start_ms": start_ms,
        "interval_s": interval_s,
        "instance": instance,
        "user": user,
        "client_id": client_id,
        **{name: counters.get(name, 0) for name in COUNTERS},
        "requests": {g: requests.get(g, 0) for g in GROUPS},
        "throttle_ms": {t: throttle_ms.get(t, 0) for t in THROTTLE_TYPES},
        "throttled": {t: throttled.get(t, 0) for t in THROTTLE_TYPES},
        "quotas": {k.value: quotas.get(k.value) for k in QUOTA_KEYS},
    }
