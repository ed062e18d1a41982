"""DescribeClientQuotas (48) and AlterClientQuotas (49), answered by the proxy itself, so
`kafka-configs.sh --bootstrap-server PROXY` and AdminClient manage the quotas the proxy enforces."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin.client_quotas import AlterClientQuotasResponse, DescribeClientQuotasResponse

from kafka_quota_proxy.protocol.api_keys import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS
from kafka_quota_proxy.protocol.error_codes import CLUSTER_AUTHORIZATION_FAILED
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quotas.control import QuotaControl
from kafka_quota_proxy.proxy.quotas.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.quota.admin_api import WireComponent, WireEntity, WireOp

SERVED = ((DESCRIBE_CLIENT_QUOTAS, 0, 1), (ALTER_CLIENT_QUOTAS, 0, 1))


def _array(value: list[Any] | None, name: str) -> list[Any]:
    # kafka-python decodes a length of -1 as None even where the schema allows no null; Kafka's
    # parser refuses such a request, and so does the proxy.
    if value is None:
        raise MalformedMessage(f"null {name} array")
    return value


def describe_components(request: Any) -> list[WireComponent]:
    """A decoded DescribeClientQuotas request's filter, as admin_api takes it."""
    return [(c.entity_type, c.match_type, c.match) for c in _array(request.components, "components")]


def alter_entries(request: Any) -> list[tuple[WireEntity, list[WireOp]]]:
    """A decoded AlterClientQuotas request's entries, as admin_api takes them."""
    return [([(e.entity_type, e.entity_name) for e in _array(entry.entity, "entity")],
             [(op.key, op.value, op.remove) for op in _array(entry.ops, "ops")])
            for entry in _array(request.entries, "entries")]


class ClientQuotasApi(RequestStage):
    """Answers DescribeClientQuotas and AlterClientQuotas at the proxy, against its own quota store."""

    api_keys = frozenset({DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS})

    def __init__(self, control: QuotaControl, engine: QuotaEngine) -> None:
        self.control = control
        self.engine = engine  # its settings change on reload

    def on_request(self, ctx: RequestContext) -> Reply | None:
        request = ctx.decode_request()
        if ctx.api_key == DESCRIBE_CLIENT_QUOTAS:
            return Reply(self._describe(request, ctx.api_version))
        return Reply(self._alter(request, ctx))

    def _describe(self, request: Any, version: int) -> bytes:
        result = self.control.describe(describe_components(request), request.strict)
        cls: Any = DescribeClientQuotasResponse
        entries = None
        if result.entries is not None:
            entries = [cls.EntryData(
                entity=[cls.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                values=[cls.EntryData.ValueData(key=k, value=v) for k, v in values.items()])
                for entity, values in result.entries]
        msg = cls(version=version, throttle_time_ms=0, error_code=result.error_code,
                  error_message=result.error_message, entries=entries)
        return bytes(msg.encode(version=version))

    def _alter(self, request: Any, ctx: RequestContext) -> bytes:
        cls: Any = AlterClientQuotasResponse
        wire = alter_entries(request)
        allowed = self.engine.settings.alter_principals
        if allowed is not None and ctx.conn.principal not in allowed:
            results: list[tuple[int, str | None]] = [
                (CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")] * len(wire)
        else:
            results = self.control.alter(wire, request.validate_only).results
        msg = cls(version=ctx.api_version, throttle_time_ms=0, entries=[
            cls.EntryData(error_code=code, error_message=message, entity=[
                cls.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity])
            for (code, message), (entity, _) in zip(results, wire, strict=True)])
        return bytes(msg.encode(version=ctx.api_version))
