"""How the quota stages count and apply a throttle, and who a request is charged to."""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
)
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine, ScopeManagers
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import throttle_type

# Exempt from the request quota, as on a broker: nothing can be charged before authentication.
REQUEST_QUOTA_EXEMPT = frozenset({SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE})


def client_of(ctx: RequestContext) -> tuple[str, str]:
    return ctx.conn.principal, ctx.header.client_id or ""


def managers(ctx: RequestContext) -> ScopeManagers:
    """The quota managers `ctx`'s connection is charged to, found when its broker connection was
    made (`ConnectionInfo.quotas`): no request reaches the stages before that."""
    found = ctx.conn.quotas
    assert found is not None, "a request charged before its broker connection was made"
    return found


def throttle(engine: QuotaEngine, ctx: RequestContext, key: QuotaKey, throttle_ms: int,
             now_ms: int, per_user: bool = False) -> None:
    """Count a throttle for the quota `key` (under its kind's quota_type, quota/kinds.py) and,
    when enforcing, hold the client for it. `per_user`: the quota is the user's alone (producer
    ids), so the throttle is counted without a client-id."""
    if throttle_ms > 0 and engine.throttled(throttle_type(key), ctx.conn.principal,
                                            ctx.header.client_id or "", throttle_ms, now_ms, per_user):
        ctx.throttle_for(throttle_ms)
