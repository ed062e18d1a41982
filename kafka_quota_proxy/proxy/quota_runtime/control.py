"""The quotas in force: the config file's `quotas:` list, overlaid by AlterClientQuotas.

What the API sets or removes is kept in a state file beside the config (written atomically), and
wins over the file key by key: an API value replaces the file's value for that entity and key,
and an API removal hides it. A later edit of the YAML file changes only what the API never
touched. Deleting the state file (with the proxy stopped) hands every key back to the YAML file.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.quota_state import (
    ApiQuotaLayer,
    change_field,
    layer_fields,
    layer_from_fields,
    load_state,
    save_state,
)
from kafka_quota_proxy.proxy.quota_runtime.audit import QuotaAudit
from kafka_quota_proxy.quota.admin_api import (
    AlterResult,
    DescribeResult,
    WireComponent,
    WireEntity,
    WireOp,
    alter_client_quotas,
    describe_client_quotas,
)
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore

Quotas = dict[QuotaEntity, dict[QuotaKey, float]]

log = logging.getLogger("kafka_quota_proxy")


class QuotaControl:
    """The quotas in force: the config file's, then those set through the API (kept in the state file)."""

    def __init__(self, store: QuotaStore, file_quotas: Mapping[QuotaEntity, Mapping[QuotaKey, float]],
                 state_path: Path | None, audit: QuotaAudit | None = None) -> None:
        self.store = store
        self.audit = audit or QuotaAudit()
        self.state_path = state_path
        self.layer = load_state(state_path) if state_path is not None else ApiQuotaLayer({}, {})
        self.file_quotas: Quotas = {e: dict(v) for e, v in file_quotas.items()}
        # With a shared store: API changes not yet written there, as store fields, in order.
        self._unshared: list[tuple[str, str]] = []
        self._apply()

    def effective(self) -> Quotas:
        return self.layer.merge_over(self.file_quotas)

    def _apply(self) -> None:
        self.store.replace(self.effective())

    def reload_file(self, file_quotas: Mapping[QuotaEntity, Mapping[QuotaKey, float]],
                    path: str = "") -> None:
        before = self.file_quotas
        self.file_quotas = {e: dict(v) for e, v in file_quotas.items()}
        self.audit.file_reload(path, before, self.file_quotas)
        self._apply()

    def describe(self, components: Sequence[WireComponent], strict: bool) -> DescribeResult:
        return describe_client_quotas(self.effective(), components, strict)

    def alter(self, entries: Sequence[tuple[WireEntity, Sequence[WireOp]]],
              validate_only: bool) -> AlterResult:
        result = alter_client_quotas(self.effective(), entries, validate_only)
        if validate_only or not result.changes:
            return result
        for change in result.changes:
            self.layer.apply(change.entity, change.key, change.value)
            self._unshared.append(change_field(change.entity, change.key, change.value))
        if self.state_path is not None:
            save_state(self.state_path, self.layer)
        self._apply()
        return result

    # -- the shared store (proxy/store/sync.py) ---------------------------------------------------

    def take_unshared(self) -> list[tuple[str, str]]:
        """API changes made here and not yet written to the store (handed back if the write fails)."""
        taken, self._unshared = self._unshared, []
        return taken

    def give_back(self, changes: list[tuple[str, str]]) -> None:
        self._unshared[:0] = changes

    def all_fields(self) -> list[tuple[str, str]]:
        """This replica's whole API layer, to seed a store that has none."""
        return layer_fields(self.layer)

    def adopt_shared(self, fields: dict[str, str]) -> list[str]:
        """The store's API layer replaces this replica's, with this replica's own unwritten
        changes on top; the state file follows. Returns the fields that were not understood."""
        layer, skipped = layer_from_fields(fields)
        if self._unshared:
            mine, _ = layer_from_fields(dict(self._unshared))
            for entity, values in mine.values.items():
                for key, value in values.items():
                    layer.apply(entity, key, value)
            for entity, keys in mine.removed.items():
                for key in keys:
                    layer.apply(entity, key, None)
        if layer == self.layer:
            return skipped
        before = self.effective()
        self.layer = layer
        after = self.effective()
        self.audit.shared_change(before, after)
        self._apply()  # in force first: a state file that cannot be written must not stop that
        if self.state_path is not None:
            try:
                save_state(self.state_path, self.layer)
            except ConfigError as exc:
                log.error("quotas from the store are in force but not saved locally: %s", exc)
        return skipped
