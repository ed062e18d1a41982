"""A scrape of the quota metrics comes from the metrics endpoint's own thread while the event
loop records into the same sensors. The soak (docs/reliability.md, "Soak") met the race: the
scrape iterated a sensor store while a request moved an entry in it, and /metrics answered 500
("OrderedDict mutated during iteration"). The collector now reads on the loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kafka_quota_proxy.config.quota_settings import QuotaSettings
from kafka_quota_proxy.proxy.observability.quota_metrics import QuotaCollector
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.support.managers import produce_bytes


def quoted_engine() -> QuotaEngine:
    """An engine that measures every client: a default client-id quota no test reaches."""
    store = QuotaStore({QuotaEntity(client_id=DEFAULT): {QuotaKey.PRODUCER_BYTE_RATE: 1e9}})
    return QuotaEngine(QuotaSettings(), store, clock=lambda: 1_000)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_a_scrape_from_another_thread_reads_on_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    engine = quoted_engine()
    produce_bytes(engine.scope("b:1")).record_and_get_throttle_ms("alice", "app", 100.0, 1_000)
    read_on: list[int] = []
    scopes = engine.scopes

    def spy() -> Iterator[object]:
        read_on.append(threading.get_ident())
        return scopes()

    engine.scopes = spy  # type: ignore[method-assign]
    registry = CollectorRegistry()
    registry.register(QuotaCollector(engine, lambda: loop))
    text = generate_latest(registry).decode()
    assert ('kafka_quota_proxy_byte_rate{client_id="app",quota_type="producer_byte_rate",scope="b:1",'
            'user=""}') in text  # a client-id quota: the measurement is shared
    loop_thread = asyncio.run_coroutine_threadsafe(_ident(), loop).result(5)
    assert read_on and set(read_on) == {loop_thread} != threading.get_ident()


async def _ident() -> int:
    return threading.get_ident()


@pytest.mark.slow  # scrapes for 2 s
def test_scrapes_while_the_loop_records_never_fail(loop: asyncio.AbstractEventLoop) -> None:
    engine = quoted_engine()
    managers = engine.scope("b:1")
    registry = CollectorRegistry()
    registry.register(QuotaCollector(engine, lambda: loop))
    stop = False

    rounds = [0]

    async def traffic() -> None:  # a request per client, round and round: entries move and arrive
        n = 0
        while not stop:
            for _ in range(200):
                n += 1
                produce_bytes(managers).record_and_get_throttle_ms("u", f"c{n % 5000}", 10.0, 1_000)
                engine.throttles.add("produce", "u", f"c{n}", 1, 1_000)
            rounds[0] += 1
            await asyncio.sleep(0)

    running = asyncio.run_coroutine_threadsafe(traffic(), loop)
    try:
        # Scrapes for 2 s, however few a loaded machine fits in (one CI run on a busy machine
        # finished a single one: a count of them is no check), while the loop records.
        deadline = time.monotonic() + 2.0
        before = rounds[0]
        while time.monotonic() < deadline:
            generate_latest(registry)  # raised RuntimeError when read on this thread
        # The loop recorded meanwhile: the scrapes ran while it did.
        assert rounds[0] > before
    finally:
        stop = True
        running.result(5)
