"""The usage record: what the proxy logs per tenant and interval, and the pipeline reads.

One JSON object per line, one line per active (user, client-id) per interval, every key always
present. The format (version 2), with an example and the file layout: docs/usage-log.md.
"""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.protocol.api_keys import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    ALTER_CLIENT_QUOTAS,
    ALTER_CONFIGS,
    ALTER_PARTITION_REASSIGNMENTS,
    ALTER_REPLICA_LOG_DIRS,
    ALTER_USER_SCRAM_CREDENTIALS,
    API_VERSIONS,
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_ACLS,
    CREATE_DELEGATION_TOKEN,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_ACLS,
    DELETE_GROUPS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    DESCRIBE_ACLS,
    DESCRIBE_CLIENT_QUOTAS,
    DESCRIBE_CLUSTER,
    DESCRIBE_CONFIGS,
    DESCRIBE_DELEGATION_TOKEN,
    DESCRIBE_GROUPS,
    DESCRIBE_LOG_DIRS,
    DESCRIBE_USER_SCRAM_CREDENTIALS,
    ELECT_LEADERS,
    END_TXN,
    EXPIRE_DELEGATION_TOKEN,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    LIST_OFFSETS,
    LIST_PARTITION_REASSIGNMENTS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    RENEW_DELEGATION_TOKEN,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_DESCRIBE,
    SHARE_GROUP_HEARTBEAT,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
    UPDATE_FEATURES,
)
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import BUILT_IN, TIME_MS, tenant_kinds

VERSION = 2
# Version 1 had no `topics`; the pipeline reads both (a missing `topics` is no topic bytes).
READABLE_VERSIONS = (1, 2)

# Requests are counted by group of API keys.
API_GROUPS: dict[str, frozenset[int]] = {
    "produce": frozenset({PRODUCE}),
    "fetch": frozenset({FETCH, SHARE_FETCH}),
    "metadata": frozenset({LIST_OFFSETS, METADATA, API_VERSIONS, OFFSET_FOR_LEADER_EPOCH, DESCRIBE_CLUSTER}),
    "group": frozenset({
        OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP,
        DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE, CONSUMER_GROUP_HEARTBEAT,
        CONSUMER_GROUP_DESCRIBE, SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_ACKNOWLEDGE}),
    "transaction": frozenset({
        INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT}),
    # topics, configs, ACLs, partitions, reassignments, quotas, delegation tokens, ...
    "admin": frozenset({
        CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS,
        DESCRIBE_CONFIGS, ALTER_CONFIGS, ALTER_REPLICA_LOG_DIRS, DESCRIBE_LOG_DIRS, CREATE_PARTITIONS,
        CREATE_DELEGATION_TOKEN, RENEW_DELEGATION_TOKEN, EXPIRE_DELEGATION_TOKEN,
        DESCRIBE_DELEGATION_TOKEN, ELECT_LEADERS, INCREMENTAL_ALTER_CONFIGS,
        ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS, DESCRIBE_CLIENT_QUOTAS,
        ALTER_CLIENT_QUOTAS, DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS,
        UPDATE_FEATURES}),
}
GROUPS = (*API_GROUPS, "other")
_GROUP_OF = {key: group for group, keys in API_GROUPS.items() for key in keys}


def throttle_types() -> tuple[str, ...]:
    """A record's throttle_ms and throttled keys: each tenant kind's throttle type, in the
    registry's order (quota/kinds.py), a registered kind's included."""
    return tuple(kind.throttle_type for kind in tenant_kinds())


def quota_keys() -> tuple[QuotaKey, ...]:
    """A record's quotas: each tenant kind's key, in the registry's order."""
    return tuple(kind.key for kind in tenant_kinds())


def counter_names() -> tuple[str, ...]:
    """A record's counters, in its layout: each tenant kind's usage counter in the registry's
    order (quota/kinds.py; a registered request-rate kind's counts its requests), then the
    tenant's new connections."""
    return (*(kind.usage_counter for kind in tenant_kinds() if kind.usage_counter), "connections")


def time_counters() -> frozenset[str]:
    """The counters that are times in ms (a kind's that adds up the requests' time): floats,
    written to 3 decimals; every other counter is a whole number."""
    return frozenset(kind.usage_counter for kind in tenant_kinds()
                     if kind.usage_counter and kind.metered[0] == TIME_MS)


# Per topic (usage_log.topics), for each kind a topic may carry (the byte rates, built in): its
# record bytes (produce_bytes written, fetch_bytes read), then those the topic's quota refused.
TOPIC_KINDS = tuple(kind for kind in BUILT_IN if kind.topic)
TOPIC_COUNTERS = (*(str(kind.usage_counter) for kind in TOPIC_KINDS),
                  *(f"{kind.measure}_refused_bytes" for kind in TOPIC_KINDS))


def api_group(api_key: int) -> str:
    return _GROUP_OF.get(api_key, "other")


def record(start_ms: int, interval_s: int, instance: str, user: str, client_id: str,
           counters: dict[str, float], requests: dict[str, int], throttle_ms: dict[str, int],
           throttled: dict[str, int], quotas: dict[str, float | None],
           topics: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """A complete version-2 record; missing counters and groups are 0, missing quotas null.
    `topics`: topic -> its TOPIC_COUNTERS, in that order ({} when not counted)."""
    types = throttle_types()
    return {
        "v": VERSION,
        "start_ms": start_ms,
        "interval_s": interval_s,
        "instance": instance,
        "user": user,
        "client_id": client_id,
        **{name: counters.get(name, 0) for name in counter_names()},
        "requests": {g: requests.get(g, 0) for g in GROUPS},
        "throttle_ms": {t: throttle_ms.get(t, 0) for t in types},
        "throttled": {t: throttled.get(t, 0) for t in types},
        "quotas": {k.value: quotas.get(k.value) for k in quota_keys()},
        "topics": {name: dict(zip(TOPIC_COUNTERS, counts, strict=True))
                   for name, counts in (topics or {}).items()},
    }
