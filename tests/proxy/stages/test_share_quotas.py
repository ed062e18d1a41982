"""KIP-932 share groups through the proxy, charged as Kafka 4.4 charges them (docs/quotas.md,
"Share groups"): a ShareFetch to the consumer byte-rate quota with its response's size, over quota
delivered with the throttle and the connection muted (the default), or answered empty as Kafka
answers it (`quota.share_fetch_throttle: empty`); a ShareAcknowledge to the request quota alone;
both responses' NodeEndpoints rewritten to the proxy's addresses. An in-process Proxy in front of
a scripted broker, the quota engine on a fake clock, so every throttle is Kafka's number to the
millisecond."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kafka_quota_proxy.protocol.error_codes import INVALID_SHARE_SESSION_EPOCH
from kafka_quota_proxy.protocol.share_fetch import read_share_fetch_request
from tests.proxy.conftest import running
from tests.proxy.quota_support import (
    LOCK_MS,
    START_MS,
    Script,
    arrival,
    broker_frames,
    connect,
    freeze,
    kafka_throttle,
    list_groups,
    metric,
    records_for_share_fetch_size,
    run,
    scope,
    share_acknowledge,
    share_fetch,
)
from tests.support.fake_broker import NODE_ID
from tests.support.managers import fetch_bytes

FETCH_QUOTA = [{"client-id": "c", "consumer_byte_rate": 100}]
KAFKAS_EMPTY = {"share_fetch_throttle": "empty"}  # Kafka 4.4's throttled ShareFetch
FETCH_CAP = 100 * 1  # the proxy caps max_bytes at one sample's worth of quota, Q*W
SHARE_SESSION_NOT_FOUND = 122


def partitions(response: Any) -> list[int]:
    return [len(p.records) for t in response.responses for p in t.partitions]


@pytest.mark.parametrize("version", [1, 2])
def test_share_fetch_over_quota_is_delivered_charged_and_muted_by_default(version: int) -> None:
    """Not Kafka's empty answer: its records are the consumer's now (the broker acquired them for
    it), so they are delivered, stay charged, and the connection is muted for the time their
    bytes take at the quota (`Pacer.pace_ms`): 2000 B at 100,000 B/s, 20 ms, where Kafka's
    throttle would be 10 ms."""
    script = Script()

    async def scenario() -> None:
        quotas = [{"client-id": "c", "consumer_byte_rate": 100_000}]
        async with running(script, quotas=quotas) as h:
            freeze(h)
            c = await connect(h)
            q = h.proxy.engine.scope(scope(h))
            script.share_records = records_for_share_fetch_size(version, 999_000)
            assert (await c.call(share_fetch(version))).throttle_time_ms == 0  # 99,900 B/s
            script.share_records = records_for_share_fetch_size(version, 2_000)
            started = asyncio.get_running_loop().time()
            second = await c.call(share_fetch(version))
            assert kafka_throttle((999_000 + 2_000) / 10, 100_000) == 10
            assert second.throttle_time_ms == 2_000 * 1000 // 100_000 == 20
            assert partitions(second) == [len(script.share_records)]  # the records, unchanged
            assert second.acquisition_lock_timeout_ms == LOCK_MS
            assert fetch_bytes(q).measure("ANONYMOUS", "c", START_MS) == 100_100  # delivered: charged
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") == 1
            corr = await c.send(list_groups())  # muted for the 20 ms (KIP-219)
            assert (await arrival(h, script, corr)) - started >= 0.020 - 0.001
            await c.recv(list_groups())
            c.close()
    run(scenario())


def test_share_fetches_delivered_over_quota_are_spaced_at_the_quota() -> None:
    """Each ShareFetch delivered over the quota is held for its bytes at the quota after the
    last one's paced time (not Kafka's throttle, which grows with the window and then lets a
    window's worth through at once), and the pace restarts once the client has been back under
    its quota for more than a sample window. A fake clock: the throttles are exact."""
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            script.share_records = records_for_share_fetch_size(1, 1000)
            assert (await c.call(share_fetch(1))).throttle_time_ms == 0  # 1000 B / 10 s = 100
            script.share_records = records_for_share_fetch_size(1, 200)
            # Over: 1200 B over 10 s. Kafka's throttle would be 2000 ms; the pace is 200 B at 100 B/s.
            assert kafka_throttle(1200 / 10, 100) == 2000
            assert (await c.call(share_fetch(1))).throttle_time_ms == 2000
            now[0] += 500  # back early (its mute is not on the fake clock): spaced after the last
            assert (await c.call(share_fetch(1))).throttle_time_ms == 2000 - 500 + 2000
            now[0] += 3500 + 900  # 900 ms after its paced time: still spaced from it
            assert (await c.call(share_fetch(1))).throttle_time_ms == 2000 - 900
            now[0] += 1100 + 1000  # a whole window after its paced time: the pace starts anew
            assert kafka_throttle(1800 / 10, 100) > 0  # 7 s in: still over Kafka's 10 s window
            assert (await c.call(share_fetch(1))).throttle_time_ms == 2000
            c.close()
    run(scenario())


@pytest.mark.parametrize("version", [1, 2])
def test_share_fetch_over_quota_gets_kafkas_throttled_empty_response(version: int) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA, quota=KAFKAS_EMPTY) as h:
            freeze(h)
            c = await connect(h)
            q = h.proxy.engine.scope(scope(h))

            script.share_records = records_for_share_fetch_size(version, 500)
            request = share_fetch(version)
            sent = [c.frame(request)]
            c.writer.write(sent[0])
            _, first = await c.recv(request)
            assert first.throttle_time_ms == 0 and partitions(first) == [len(script.share_records)]
            assert fetch_bytes(q).measure("ANONYMOUS", "c", START_MS) == 50.0  # 500 B over 10 s

            script.share_records = records_for_share_fetch_size(version, 505)
            started = asyncio.get_running_loop().time()
            sent.append(c.frame(request))
            c.writer.write(sent[1])
            _, second = await c.recv(request)
            expected = kafka_throttle((500 + 505) / 10, 100)
            assert expected == 50
            assert (second.throttle_time_ms, second.error_code, second.responses,
                    second.node_endpoints) == (expected, 0, [], [])
            assert second.acquisition_lock_timeout_ms == LOCK_MS  # the broker's, kept
            # The bytes the client never got are taken back, as Kafka unrecords them.
            assert fetch_bytes(q).measure("ANONYMOUS", "c", START_MS) == 50.0
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") == 1

            # Each forwarded ShareFetch had max_bytes capped and nothing else changed.
            received = broker_frames(h)
            assert len(received) == 2
            body_offset = len(sent[0]) - len(bytes(request.encode(version=version)))
            for original, forwarded in zip(sent, received, strict=True):
                info = read_share_fetch_request(memoryview(forwarded), body_offset)
                at = info.max_bytes_at
                assert info.max_bytes == FETCH_CAP
                assert read_share_fetch_request(memoryview(original), body_offset).max_bytes == 52_428_800
                assert forwarded[:at] + forwarded[at + 4:] == original[:at] + original[at + 4:]

            corr = await c.send(list_groups())  # muted for the 50 ms (KIP-219)
            assert (await arrival(h, script, corr)) - started >= 0.050 - 0.001
            await c.recv(list_groups())
            c.close()
    run(scenario())


@pytest.mark.parametrize("mode", ["deliver", "empty"])
def test_share_fetch_throttle_follows_the_window_as_fetch_does(mode: str) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA, quota={"share_fetch_throttle": mode}) as h:
            now = freeze(h)
            c = await connect(h)
            script.share_records = records_for_share_fetch_size(1, 1000)
            assert (await c.call(share_fetch(1))).throttle_time_ms == 0  # 1000 B / 10 s = 100
            now[0] += 5000  # 1000 + 1100 over the 10 s the window still counts
            script.share_records = records_for_share_fetch_size(1, 1100)
            response = await c.call(share_fetch(1))
            assert response.throttle_time_ms == kafka_throttle(2100 / 10, 100) == 11_000
            assert partitions(response) == ([len(script.share_records)] if mode == "deliver" else [])
            c.close()
    run(scenario())


def test_throttled_share_fetch_keeps_the_brokers_session_epoch_error_and_larger_throttle() -> None:
    script = Script()
    script.share_error = INVALID_SHARE_SESSION_EPOCH
    script.share_throttle = 3000

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA, quota=KAFKAS_EMPTY) as h:
            freeze(h)
            c = await connect(h)
            script.share_records = records_for_share_fetch_size(1, 1005)
            response = await c.call(share_fetch(1))
            # Kafka's ShareSessionContext.throttleResponse answers this error when the epoch moved.
            assert (response.error_code, response.throttle_time_ms, response.responses) == (
                INVALID_SHARE_SESSION_EPOCH, 3000, [])
            assert metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="fetch",
                          user="ANONYMOUS", client_id="c") == 50
            c.close()
    run(scenario())


def test_a_share_fetch_error_response_is_not_charged_bytes() -> None:
    """Kafka answers a ShareFetch that fails before fetching (no session, not authorized) through
    sendMaybeThrottle: the request quota only."""
    script = Script()
    script.share_error = SHARE_SESSION_NOT_FOUND
    script.share_records = b"r" * 5000

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            response = await c.call(share_fetch(1))
            assert (response.error_code, response.throttle_time_ms) == (SHARE_SESSION_NOT_FOUND, 0)
            assert partitions(response) == [5000]
            assert fetch_bytes(h.proxy.engine.scope(scope(h))).measure("ANONYMOUS", "c", START_MS) == 0
            c.close()
    run(scenario())


def test_share_acknowledge_is_not_charged_to_the_byte_rate() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=FETCH_QUOTA) as h:
            freeze(h)
            c = await connect(h)
            for _ in range(5):
                assert (await c.call(share_acknowledge(1))).throttle_time_ms == 0
            assert len(fetch_bytes(h.proxy.engine.scope(scope(h))).sensors) == 0
            c.close()
    run(scenario())


@pytest.mark.parametrize("api", ["share_fetch", "share_acknowledge"])
@pytest.mark.parametrize("version", [1, 2])
def test_node_endpoints_name_the_proxy(api: str, version: int) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script) as h:
            script.node_endpoints = [(NODE_ID, "127.0.0.1", h.broker.port)]
            c = await connect(h)
            request = share_fetch(version) if api == "share_fetch" else share_acknowledge(version)
            response = await c.call(request)
            assert [(n.node_id, n.host, n.port, n.rack) for n in response.node_endpoints] == [
                (NODE_ID, "127.0.0.1", h.settings.node_port(NODE_ID), None)]
            assert response.responses[0].partitions[0].partition_index == 0  # the rest intact
            c.close()
    run(scenario())
