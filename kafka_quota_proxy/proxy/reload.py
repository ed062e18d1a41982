"""Watching the config file: quotas and quota switches change without a restart.

The file is polled once a second (no inotify dependency; works on every filesystem and in
containers with bind-mounted files). A change is validated as a whole first: a bad file is
refused with one error line and the last good quotas stay in force. Only the `quotas:` list and
the `quota:` section apply at run time; other keys need a restart, and a change to them is
reported as such.
"""

from __future__ import annotations

import logging
from typing import Protocol

from kafka_quota_proxy.config import ConfigError, Settings, load_file
from kafka_quota_proxy.config.quota_settings import QuotaSettings, validate_quota_entries
from kafka_quota_proxy.proxy.file_watch import watch_files
from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.resolution import QuotaStore

log = logging.getLogger("kafka_quota_proxy.reload")
POLL_SECONDS = 1.0
RUN_TIME_KEYS = ("quota", "quotas", "config_path")


class Reloadable(Protocol):
    """What a config reload changes in a running proxy (server.Proxy is the one implementation)."""

    settings: Settings
    engine: QuotaEngine
    quota_control: QuotaControl
    quotas: QuotaStore


async def watch_config(path: str, proxy: Reloadable, poll_seconds: float = POLL_SECONDS) -> None:
    await watch_files([path], poll_seconds, lambda: reload_config(path, proxy))


def reload_config(path: str, proxy: Reloadable) -> bool:
    """Apply the file's quotas and quota switches; False (and the old ones kept) if it is bad."""
    try:
        values = load_file(path)
        file_quotas = validate_quota_entries(values.get("quotas", ()), path)
    except ConfigError as exc:
        log.error("config reload refused, the last good quotas stay in force: %s", exc)
        proxy.quota_control.audit.file_refused(path, str(exc))
        return False
    current = proxy.settings
    ignored = sorted(k for k, v in values.items()
                     if k not in RUN_TIME_KEYS and getattr(current, k) != v)
    if ignored:
        log.warning("config reload: %s changed; restart the proxy to apply", ", ".join(ignored))
    restart = proxy.engine.update(values.get("quota", QuotaSettings()))
    if restart:
        log.warning("config reload: quota.%s changed; restart the proxy to apply",
                    ", quota.".join(restart))
    proxy.quota_control.reload_file(file_quotas, path)
    log.info("config reloaded from %s: %d quota entit%s in force, mode %s", path,
             len(proxy.quotas.entries()), "y" if len(proxy.quotas.entries()) == 1 else "ies",
             proxy.engine.settings.mode)
    return True
