"""How the quota stages count and apply a throttle, and who a request is charged to."""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
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
        ctx.throttle_for(throttle_ms)
