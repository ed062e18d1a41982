"""Reading `--quotas` and `--candidate`: YAML in the proxy's own config format.

A file may be a whole proxy config or just a `quotas:` list; only `quotas:` and the window
settings of `quota:` are used, and they are checked by the proxy's own validators, so a file
the analysis accepts is one the proxy (and AlterClientQuotas) would accept too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.loading import load_document
from kafka_quota_proxy.config.quota_settings import (
    parse_quota_list,
    parse_quota_section,
    validate_quota_entries,
)
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey

Quotas = dict[QuotaEntity, dict[QuotaKey, float]]


@dataclass(frozen=True, slots=True)
class QuotaFile:
    """The validated quotas of one file, and its window settings if its `quota:` section set them."""

    path: str
    quotas: Quotas
    window_num: int | None = None
    window_size_seconds: int | None = None


def load_quota_file(path: str) -> QuotaFile:
    """Read and validate `path`; a ConfigError names the file and what is wrong with it."""
    raw: Any = load_document(path, "file")
    if not isinstance(raw, dict) or "quotas" not in raw:
        raise ConfigError("quotas", "missing: expected a `quotas:` list as in the proxy's config file",
                          path)
    try:
        entries = parse_quota_list(raw["quotas"])
        section = raw.get("quota") or {}
        settings = parse_quota_section(section)
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.message, path) from None
    quotas = validate_quota_entries(entries, source=path)
    explicit = section if isinstance(section, dict) else {}
    return QuotaFile(path, quotas,
                     settings.window_num if "window_num" in explicit else None,
                     settings.window_size_seconds if "window_size_seconds" in explicit else None)
