"""`check-config --probe-store`: reach the store and run the calls one sync makes."""

from __future__ import annotations

import asyncio
import time

from kafka_quota_proxy.config.store_settings import StoreSettings
from kafka_quota_proxy.proxy.store.calls import reason_of
from kafka_quota_proxy.proxy.store.sync import StoreSync
from kafka_quota_proxy.quota.rate import MetricConfig
from kafka_quota_proxy.quota.shared import SharedQuotas


async def probe(settings: StoreSettings) -> tuple[bool, str]:
    """(reachable, one line saying what was found). Writes nothing a proxy would count: a
    heartbeat under a probe's own replica id (gone after a few seconds) and no entities."""
    shared = SharedQuotas(MetricConfig(), settings.effective_buckets)
    sync = StoreSync(settings, shared, replica="check-config")
    started = time.monotonic()
    try:
        async with asyncio.timeout(settings.timeout_ms / 1000):  # the client has no read timeout
            info = await sync.client.info("server")
        ok = await sync.sync_once()
        if not ok:
            return False, f"FAILED: {settings.redacted_url}: the sync's calls did not succeed"
        took = (time.monotonic() - started) * 1000
        name = "valkey" if "valkey_version" in info else "redis"
        version = info.get("valkey_version") or info.get("redis_version") or "?"
        return True, (f"OK: {name} {version} at {settings.redacted_url}, a sync in {took:.1f} ms, "
                      f"{sync.shared.live_replicas} replica(s) with a heartbeat")
    except Exception as exc:  # noqa: BLE001 - any failure is the probe's answer
        return False, f"FAILED: {settings.redacted_url}: {reason_of(exc)}"
    finally:
        await sync.close()
