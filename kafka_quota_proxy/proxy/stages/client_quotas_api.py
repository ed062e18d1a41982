"""DescribeClientQuotas (48) and AlterClientQuotas (49), answered by the proxy itself, so
`kafka-configs.sh --bootstrap-server PROXY` and AdminClient manage the quotas the proxy enforces.

Only principals allowed to (proxy/quota_runtime/access.py) may: anyone else gets
CLUSTER_AUTHORIZATION_FAILED, as from a Kafka broker's authorizer, in Kafka's shape (Describe: the
error and no entries; Alter: the error on every entry). Every change asked for, done or refused,
is one audit line and one count (proxy/quota_runtime/audit.py).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin.client_quotas import AlterClientQuotasResponse, DescribeClientQuotasResponse

from kafka_quota_proxy.protocol.api_keys import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS
from kafka_quota_proxy.protocol.error_codes import CLUSTER_AUTHORIZATION_FAILED
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.access import QuotaAccess
from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.quota.admin_api import DescribeResult, WireComponent, WireEntity, WireOp

SERVED = ((DESCRIBE_CLIENT_QUOTAS, 0, 1), (ALTER_CLIENT_QUOTAS, 0, 1))


def not_null(array: Any, name: str) -> Any:
    """A request array that the schema says is never null (kafka-python reads length -1 as None;
    Kafka's parser refuses such a request, and so does the proxy)."""
    if array is None:
        raise MalformedMessage(f"{name} is null")
    return array


def describe_components(request: Any) -> list[WireComponent]:
    """A decoded DescribeClientQuotas request's filter, as admin_api takes it."""
    return [(c.entity_type, c.match_type, c.match) for c in not_null(request.components, "components")]


def alter_entries(request: Any) -> list[tuple[WireEntity, list[WireOp]]]:
    """A decoded AlterClientQuotas request's entries, as admin_api takes them."""
    return [([(e.entity_type, e.entity_name) for e in not_null(entry.entity, "entity")],
             [(op.key, op.value, op.remove) for op in not_null(entry.ops, "ops")])
            for entry in not_null(request.entries, "entries")]


def describe_response(result: DescribeResult, version: int) -> bytes:
    """A DescribeClientQuotas response body for `result`."""
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


def alter_response(results: list[tuple[int, str | None]], wire: list[tuple[WireEntity, list[WireOp]]],
                   version: int) -> bytes:
    """An AlterClientQuotas response body: each request entry with its (error code, message)."""
    cls: Any = AlterClientQuotasResponse
    msg = cls(version=version, throttle_time_ms=0, entries=[
        cls.EntryData(error_code=code, error_message=message, entity=[
            cls.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity])
        for (code, message), (entity, _) in zip(results, wire, strict=True)])
    return bytes(msg.encode(version=version))


class ClientQuotasApi(RequestStage):
    """Answers DescribeClientQuotas and AlterClientQuotas at the proxy, against its own quota store."""

    api_keys = frozenset({DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS})

    def __init__(self, control: QuotaControl, engine: QuotaEngine, access: QuotaAccess) -> None:
        self.control = control
        self.engine = engine  # its settings change on reload
        self.access = access

    def on_request(self, ctx: RequestContext) -> Reply | None:
        request = ctx.decode_request()
        if ctx.api_key == DESCRIBE_CLIENT_QUOTAS:
            return Reply(self._describe(request, ctx))
        return Reply(self._alter(request, ctx))

    def _describe(self, request: Any, ctx: RequestContext) -> bytes:
        verdict = self.access.may_describe(self.engine.settings, ctx.conn.principal, ctx.conn.ip)
        if not verdict.allowed:
            self.access.note_refusal(self.engine.settings)
            result = DescribeResult(CLUSTER_AUTHORIZATION_FAILED, verdict.reason, None)
        else:
            result = self.control.describe(describe_components(request), request.strict)
        return describe_response(result, ctx.api_version)

    def _alter(self, request: Any, ctx: RequestContext) -> bytes:
        wire = alter_entries(request)
        conn = ctx.conn
        verdict = self.access.may_alter(self.engine.settings, conn.principal, conn.ip)
        before = self.control.effective()
        results: list[tuple[int, str | None]]
        if not verdict.allowed:
            self.access.note_refusal(self.engine.settings)
            results = [(CLUSTER_AUTHORIZATION_FAILED, verdict.reason)] * len(wire)
        else:
            results = self.control.alter(wire, request.validate_only).results
        self.control.audit.api_alter(conn.principal, conn.peer, before, wire, results, request.validate_only)
        return alter_response(results, wire, ctx.api_version)

