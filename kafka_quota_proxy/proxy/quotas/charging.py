"""What every quota stage shares: who is charged, how a throttle is counted and applied, and what
the request quota charges for one request.

Request time at a proxy. The proxy cannot see broker threads, so it charges the proxy's own
processing time for the request and its response, plus the broker's service time as seen from
the proxy, except for requests a broker answers only after waiting by design (`WAITING_APIS`:
a long-poll Fetch, Produce with acks=all, coordinator lookups and group membership, offset and
transaction commits, controller operations), whose broker time is mostly waiting, not work, and
is not charged. An idle consumer long-polling an empty topic costs almost nothing, while a
client busy-polling (Metadata, ListOffsets, Fetch with max_wait_ms=0) pays for every trip.
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    ALTER_CONFIGS,
    ALTER_PARTITION_REASSIGNMENTS,
    API_VERSIONS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    ELECT_LEADERS,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
)
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quotas.engine import QuotaEngine
from kafka_quota_proxy.quota.resolution import sanitize_user

# Exempt from the request quota, as on a broker: nothing can be charged before authentication.
REQUEST_QUOTA_EXEMPT = frozenset({SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE})


def client_of(ctx: RequestContext) -> tuple[str, str]:
    return ctx.conn.principal, ctx.header.client_id or ""


def throttle(engine: QuotaEngine, ctx: RequestContext, quota_type: str, throttle_ms: int,
             now_ms: int, per_user: bool = False) -> None:
    """Count a throttle and, when enforcing, hold the client for it. `per_user`: the quota is
    the user's alone (producer ids), so the throttle is counted without a client-id."""
    if throttle_ms <= 0:
        return
    user, client_id = client_of(ctx)
    engine.throttles.add(quota_type, sanitize_user(user), "" if per_user else client_id, throttle_ms, now_ms)
    if engine.usage is not None:
        engine.usage.throttled(user, client_id, quota_type, throttle_ms)
    if engine.enforcing:
        ctx.throttle_ms = max(ctx.throttle_ms, throttle_ms)


# Answered after a wait: for a coordinator (FindCoordinator can wait for one to load), for a
# rebalance, for replication of an offset or transaction commit, or for the controller.
WAITING_APIS = frozenset({
    FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP,
    OFFSET_COMMIT, TXN_OFFSET_COMMIT,
    INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN,
    CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, CREATE_PARTITIONS, ELECT_LEADERS,
    INCREMENTAL_ALTER_CONFIGS, ALTER_PARTITION_REASSIGNMENTS, ALTER_CONFIGS,
})


def _waits_at_broker(ctx: RequestContext) -> bool:
    key = ctx.api_key
    if key == FETCH:
        return ctx.fetch_max_wait_ms > 0
    if key == PRODUCE:
        return ctx.acks == -1
    return key in WAITING_APIS


def request_time_ms(ctx: RequestContext, now: float) -> float:
    """What the request quota charges for one request; see the module docstring."""
    proxy = (ctx.sent_at - ctx.received_at) + (now - ctx.answered_at)
    broker = 0.0 if _waits_at_broker(ctx) else ctx.answered_at - ctx.sent_at
    return (proxy + broker) * 1000.0


