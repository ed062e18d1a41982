"""DescribeClientQuotas (48) and AlterClientQuotas (49), answered by the proxy itself, so
`kafka-configs.sh --bootstrap-server PROXY` and AdminClient manage the quotas the proxy enforces.

Only principals allowed to (proxy/quotas/access.py) may: anyone else gets
CLUSTER_AUTHORIZATION_FAILED, as from a Kafka broker's authorizer, in Kafka's shape (Describe: the
error and no entries; Alter: the error on every entry). Every change asked for, done or refused,
is one audit line and one count (proxy/quotas/audit.py).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin.client_quotas import AlterClientQuotasResponse, DescribeClientQuotasResponse

from kafka_quota_proxy.protocol.api_keys import ALTER_CLIENT_QUOTAS, DESCRIBE_CLIENT_QUOTAS
from kafka_quota_proxy.protocol.error_codes import CLUSTER_AUTHORIZATION_FAILED
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quotas.access import QuotaAccess
from kafka_quota_proxy.proxy.quotas.audit import ACCEPTED, API, REFUSED, VALIDATED, wire_entity
from kafka_quota_proxy.proxy.quotas.control import QuotaControl
from kafka_quota_proxy.proxy.quotas.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.quota.admin_api import (
    DescribeResult,
    QuotaRequestError,
    WireComponent,
    WireEntity,
    WireOp,
    entity_from_wire,
)
from kafka_quota_proxy.quota.entities import QuotaKey

log = logging.getLogger("kafka_quota_proxy.quotas")

SERVED = ((DESCRIBE_CLIENT_QUOTAS, 0, 1), (ALTER_CLIENT_QUOTAS, 0, 1))

UPGRADE_NOTE = ("quota management through the proxy is closed unless quota.alter_principals says "
                "who may change quotas (and quota.describe_principals who may read them); set "
                "quota.alter_principals to your admin principals, or to [\"*\"] for the old open "
                "behaviour (docs/quotas.md, \"Who may change quotas\")")


def _items(array: Any, name: str) -> Any:
    """A request array that the schema says is never null (kafka-python reads length -1 as None;
    Kafka's parser refuses such a request, and so does the proxy)."""
    if array is None:
        raise MalformedMessage(f"{name} is null")
    return array


def describe_components(request: Any) -> list[WireComponent]:
    """A decoded DescribeClientQuotas request's filter, as admin_api takes it."""
    return [(c.entity_type, c.match_type, c.match) for c in _items(request.components, "components")]


def alter_entries(request: Any) -> list[tuple[WireEntity, list[WireOp]]]:
    """A decoded AlterClientQuotas request's entries, as admin_api takes them."""
    return [([(e.entity_type, e.entity_name) for e in _items(entry.entity, "entity")],
             [(op.key, op.value, op.remove) for op in _items(entry.ops, "ops")])
            for entry in _items(request.entries, "entries")]


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
        self._upgrade_noted = False

    def on_request(self, ctx: RequestContext) -> Reply | None:
        request = ctx.decode_request()
        if ctx.api_key == DESCRIBE_CLIENT_QUOTAS:
            return Reply(self._describe(request, ctx))
        return Reply(self._alter(request, ctx))

    def _describe(self, request: Any, ctx: RequestContext) -> bytes:
        verdict = self.access.may_describe(self.engine.settings, ctx.conn.principal, ctx.conn.ip)
        if not verdict.allowed:
            self._note_upgrade()
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
            self._note_upgrade()
            results = [(CLUSTER_AUTHORIZATION_FAILED, verdict.reason)] * len(wire)
        else:
            results = self.control.alter(wire, request.validate_only).results
        done = VALIDATED if request.validate_only else ACCEPTED
        for (code, message), (entity, ops) in zip(results, wire, strict=True):
            try:
                old = before.get(entity_from_wire(entity), {})
            except QuotaRequestError:
                old = {}
            for key, value, remove in ops:
                try:
                    was = old.get(QuotaKey(key))
                except ValueError:
                    was = None
                self.control.audit.record(
                    API, REFUSED if code else done, conn.principal, conn.peer, wire_entity(entity), key,
                    was, None if remove else value, message if code else None)
        return alter_response(results, wire, ctx.api_version)

    def _note_upgrade(self) -> None:
        """Once a process, when the operator never said who may manage quotas: what to set."""
        if self.engine.settings.alter_principals is None and not self._upgrade_noted:
            self._upgrade_noted = True
            log.warning("a quota request was refused: %s", UPGRADE_NOTE)
