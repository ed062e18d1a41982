"""The request-rate kinds registered in quota/kinds.py (`QuotaKind.counts`): each request of a
kind's API keys is counted once on the kind's manager, Kafka's ClientQuotaManager over that
count (ScopeManagers.rates), and a request over the rate is throttled by Kafka's rule
(KIP-219: told, and its connection muted). The one stage every such kind shares: a new one is
declared in kinds.py alone."""

from __future__ import annotations

from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.proxy.stages.throttling import managers, throttle
from kafka_quota_proxy.quota.kinds import QuotaKind, counting


class RequestCounts(RequestStage):
    """Charge each request of `kinds`' API keys to their managers, one each."""

    def __init__(self, engine: QuotaEngine, kinds: tuple[QuotaKind, ...]) -> None:
        self.engine = engine
        self._by_api = {api: tuple(kinds[i].key for i in indexes) for api, indexes in counting(kinds).items()}
        self.api_keys = frozenset(self._by_api)

    def on_request(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        user, client_id = ctx.conn.principal, ctx.header.client_id or ""
        charging = engine.charging(user, client_id)
        if charging is None:
            return None
        now = charging[1]
        q = managers(ctx)
        for key in self._by_api[ctx.header.api_key]:
            throttle_ms = q.rates[key].record_and_get_throttle_ms(user, client_id, 1.0, now)
            throttle(engine, ctx, key, throttle_ms, now)
        return None
