"""The usage record: what the proxy logs per tenant and interval, and the pipeline reads.

One JSON object per line, one line per active (user, client-id) per interval, every key always
present. The format (version 1), with an example and the file layout: docs/usage-log.md.
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
