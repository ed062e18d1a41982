"""The audit trail of quota changes: one log line and one count for every change asked for,
through AlterClientQuotas or an edit of the config file, accepted or refused.

Each line gives who asked (the principal, or `config-file`), from where (the client's address,
or the file's path), the entity, the key, the value before and the value asked for. The lines go
to the `kafka_quota_proxy.audit` logger, so they can be routed apart; they never hold
credentials, only principal names.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from kafka_quota_proxy.quota.admin_api import QuotaRequestError, WireEntity, WireOp, entity_from_wire
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import key_named

log = logging.getLogger("kafka_quota_proxy.audit")

API, FILE, STORE = "api", "file", "store"
ACCEPTED, REFUSED, VALIDATED = "accepted", "refused", "validated"  # validated: validate_only

Quotas = dict[QuotaEntity, dict[QuotaKey, float]]


def _value(value: float | None) -> str:
    if value is None:
        return "none"
    if not math.isfinite(value):  # asked for, and refused: int() of it would raise
        return repr(value)
    return str(int(value)) if value == int(value) and abs(value) < 2**53 else repr(value)


def wire_entity(entity: Sequence[tuple[str, str | None]]) -> str:
    """A wire entity as `type=name` pairs; the default (a null name) as <default>."""
    return ", ".join(f"{kind}={'<default>' if name is None else name}" for kind, name in entity) or "(none)"


class QuotaAudit:
    """Records quota changes; `count(source, outcome)` keeps the metric."""

    def __init__(self, count: Callable[[str, str], None] = lambda source, outcome: None) -> None:
        self.count = count

    def record(self, source: str, outcome: str, principal: str, address: str, entity: str, key: str,
               old: float | None, new: float | None, reason: str | None = None) -> None:
        self.count(source, outcome)
        line = (f"quota change {outcome}: source={source} principal={principal} address={address} "
                f"entity=[{entity}] key={key} old={_value(old)} new={_value(new)}")
        if reason:
            line += f" reason={reason!r}"
        log.log(logging.WARNING if outcome == REFUSED else logging.INFO, "%s", line)

    def api_alter(self, principal: str, address: str, before: Quotas,
                  wire: Sequence[tuple[WireEntity, Sequence[WireOp]]],
                  results: Sequence[tuple[int, str | None]], validate_only: bool) -> None:
        """Every op of an alteration asked for through the API (AlterClientQuotas, or a topic's
        quota keys in IncrementalAlterConfigs), with its entry's outcome; `before` is what was
        in force."""
        done = VALIDATED if validate_only else ACCEPTED
        for (code, message), (entity, ops) in zip(results, wire, strict=True):
            try:
                old = before.get(entity_from_wire(entity), {})
            except QuotaRequestError:
                old = {}
            for key, value, remove in ops:
                known = key_named(key)
                was = None if known is None else old.get(known)
                self.record(API, REFUSED if code else done, principal, address, wire_entity(entity), key,
                            was, None if remove else value, message if code else None)

    def file_reload(self, path: str, before: Quotas, after: Quotas) -> None:
        """Every key an edit of the config file changed, in a stable order."""
        self._changes(FILE, "config-file", path, before, after)

    def shared_change(self, before: Quotas, after: Quotas) -> None:
        """Every key that changed here because another replica changed it in the shared store
        (that replica's own audit line names who asked)."""
        self._changes(STORE, "another-replica", "quota-store", before, after)

    def _changes(self, source: str, principal: str, address: str, before: Quotas,
                 after: Quotas) -> None:
        for entity in sorted(set(before) | set(after), key=lambda e: e.describe()):
            old, new = before.get(entity, {}), after.get(entity, {})
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    self.record(source, ACCEPTED, principal, address, entity.describe(), key.value,
                                old.get(key), new.get(key))

    def file_refused(self, path: str, reason: str) -> None:
        self.record(FILE, REFUSED, "config-file", path, "(whole file)", "-", None, None, reason)
