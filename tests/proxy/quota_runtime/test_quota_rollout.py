"""The rollout switches (observe, exempt, off) and the quota metrics, in-process."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_quota_proxy.protocol.headers import frame_response
from tests.proxy.conftest import (
    running,
)
from tests.proxy.quota_support import (
    PRODUCE_QUOTA,
    START_MS,
    Script,
    broker_frames,
    connect,
    fetch,
    fetch_response,
    freeze,
    metric,
    produce,
    produce_response,
    run,
    scope,
)
from tests.support.managers import fetch_bytes, produce_bytes, request_time

# --- rollout switches ---------------------------------------------------------------------------

def test_observe_mode_counts_throttles_but_changes_nothing() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota={"mode": "observe"}, quotas=[
                {"client-id": "c", "producer_byte_rate": 500, "consumer_byte_rate": 100}]) as h:
            freeze(h)
            c = await connect(h)
            for n in (1, 2):
                request = produce(7, 5040)
                corr = await c.send(request)
                raw, _ = await c.recv(request)
                assert raw == frame_response(corr, 0, produce_response(7, 0))
                assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="produce",
                              user="ANONYMOUS", client_id="c") == n
            script.fetch_records = b"r" * 5000
            request = fetch(11)
            frame = c.frame(request)
            c.writer.write(frame)
            raw, _ = await c.recv(request)
            assert raw[8:] == fetch_response(11, 0, script.fetch_records)
            assert broker_frames(h)[-1] == frame  # max_bytes not capped either
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") == 1
            (conn,) = h.proxy.connections
            assert conn.core.mute.until == 0.0  # never muted
            assert metric(h, "kafka_quota_proxy_quota_mode", mode="observe") == 1.0
            c.close()
    run(scenario())


@pytest.mark.parametrize("switch", [{"exempt_client_ids": ["c"]}, {"exempt_principals": ["ANONYMOUS"]}])
def test_exempt_clients_are_never_measured(switch: dict[str, Any]) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota=switch, quotas=[
                {"client-id": "<default>", "producer_byte_rate": 500, "request_percentage": 1}]) as h:
            freeze(h)
            c = await connect(h)
            for _ in range(3):
                assert (await c.call(produce(7, 20_000))).throttle_time_ms == 0
            q = h.proxy.engine.scope(scope(h))
            assert len(produce_bytes(q).sensors) == 0 and len(request_time(q).sensors) == 0
            assert produce_bytes(q).quota("ANONYMOUS", "c") == 500  # the quota exists, it just is not applied
            c.close()
    run(scenario())


def test_mode_off_measures_nothing() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota={"mode": "off", "window_num": 2}, quotas=[
                *PRODUCE_QUOTA, {"ip": "<default>", "connection_creation_rate": 1}]) as h:
            freeze(h)
            clients = [await connect(h) for _ in range(3)]  # over 1/s: all served when off
            for c in clients:
                assert (await c.call(produce(7, 20_000))).throttle_time_ms == 0
            # The connections found their scope's managers on connecting; none measured anything.
            assert [(len(produce_bytes(q).sensors), len(fetch_bytes(q).sensors), len(request_time(q).sensors))
                    for _, q in h.proxy.engine.scopes()] == [(0, 0, 0)]
            assert h.proxy.engine.connections.measure("127.0.0.1", START_MS) == 0.0
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="produce",
                          user="ANONYMOUS", client_id="c") is None
            for c in clients:
                c.close()
    run(scenario())


# --- metrics ------------------------------------------------------------------------------------

def test_quota_metrics_after_traffic() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=PRODUCE_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            assert (await c.call(produce(7, 5040))).throttle_time_ms == 80
            labels = {"scope": scope(h), "user": "", "client_id": "c"}
            assert metric(h, "kafka_quota_proxy_byte_rate", quota_type="producer_byte_rate",
                          **labels) == 504.0
            assert metric(h, "kafka_quota_proxy_quota_limit", quota_type="producer_byte_rate",
                          **labels) == 500.0
            assert metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="produce",
                          user="ANONYMOUS", client_id="c") == 80
            assert metric(h, "kafka_quota_proxy_configured_quota", quota_type="producer_byte_rate",
                          user="", client_id="c", ip="", topic="") == 500.0
            assert metric(h, "kafka_quota_proxy_quota_entities_dropped_total") == 0
            c.close()
    run(scenario())


def test_capped_tracker_counts_dropped_entities() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quota={"max_tracked_entities": 1},
                           quotas=[{"client-id": "<default>", "producer_byte_rate": 1_000_000}]) as h:
            freeze(h)
            c = await connect(h)
            for n, client_id in enumerate(("a", "b", "z", "a")):
                assert (await c.call(produce(7), client_id=client_id)).throttle_time_ms == 0
                assert metric(h, "kafka_quota_proxy_quota_entities_dropped_total") == [0, 1, 2, 2][n]
            q = h.proxy.engine.scope(scope(h))
            assert [key for key, _ in produce_bytes(q).sensors.entries(START_MS)] == [("Produce", "", "a")]
            c.close()
    run(scenario())
