"""Request-time, controller-mutation and connection quotas end to end, in-process against a
scripted broker, on the fake clock."""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.admin.topics import (
    DeleteTopicsRequest,
)

from tests.proxy.conftest import (
    correlation_id,
    is_closed,
    read_frame,
    running,
)
from tests.proxy.quota_support import (
    MUTATION_QUOTA,
    START_MS,
    Client,
    Script,
    api_versions,
    broker_frames,
    connect,
    create_topics,
    freeze,
    list_groups,
    metric,
    run,
    scope,
)
from tests.support.managers import mutation_bucket, request_time

# --- request quota ------------------------------------------------------------------------------

def test_request_quota_throttles_slow_requests_for_at_most_one_window() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=[{"client-id": "c", "request_percentage": 2}]) as h:
            freeze(h)
            c = await connect(h)
            q = h.proxy.engine.scope(scope(h))
            versions = await c.call(api_versions())
            assert versions.throttle_time_ms == 0
            assert len(request_time(q).sensors) == 0  # ApiVersions is not charged

            # A fast request: its time (proxy and broker) is charged, well under 2 % of a thread.
            assert (await c.call(list_groups())).throttle_time_ms == 0
            charged = request_time(q).measure("ANONYMOUS", "c", START_MS)
            assert 0 < charged < 2

            # 300 ms of broker time: 30 %-s over a fresh 10 s window is 3 %, and
            # (3 - 2) / 2 * 10 s is far over the bound of one window.
            script.delay = 0.3
            response = await c.call(list_groups())
            assert response.throttle_time_ms == 1000
            assert request_time(q).measure("ANONYMOUS", "c", START_MS) >= 3.0
            assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="request",
                          user="ANONYMOUS", client_id="c") == 1
            c.close()
    run(scenario())


# --- controller mutations -----------------------------------------------------------------------


# 1000 partitions, 110 explicit assignments, and num_partitions -1 (the broker default, 1): 1111
BIG = [("t1", 1000, 0), ("t2", 0, 110), ("t3", -1, 0)]


def test_strict_create_topics_over_quota_is_refused_by_the_proxy() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=MUTATION_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            q = h.proxy.engine.scope(scope(h))
            first = await c.call(create_topics(6, BIG))
            # The bucket was not below zero: accepted in full, forwarded, not throttled.
            assert first.throttle_time_ms == 0
            assert [t.error_code for t in first.topics] == [0, 0, 0]
            assert mutation_bucket(q).tokens("ANONYMOUS", "c", now[0]) == 1100 - 1111
            assert script.api_keys == [19]

            refused = await c.call(create_topics(6, [("x", 1, 0), ("y", 2, 0)]))
            assert refused.throttle_time_ms == 110  # round(11 / 100 * 1000)
            assert [(t.name, t.error_code, t.error_message) for t in refused.topics] == [
                ("x", 89, "The throttling quota has been exceeded."),
                ("y", 89, "The throttling quota has been exceeded.")]
            assert mutation_bucket(q).tokens("ANONYMOUS", "c", now[0]) == -11  # nothing recorded

            now[0] += 60  # 6 tokens back: 5 short
            again = await c.call(create_topics(7, [("x", 1, 0)]))
            assert again.throttle_time_ms == 50
            assert [t.error_code for t in again.topics] == [89]
            assert script.api_keys == [19]  # neither refusal reached the broker
            assert metric(h, "kafka_quota_proxy_throttled_requests_total",
                          quota_type="controller_mutation", user="ANONYMOUS", client_id="c") == 2
            c.close()
    run(scenario())


def test_permissive_create_topics_is_forwarded_and_throttled() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=MUTATION_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            response = await c.call(create_topics(5, BIG))
            assert response.throttle_time_ms == 110
            assert [t.error_code for t in response.topics] == [0, 0, 0]
            assert script.api_keys == [19]
            q = h.proxy.engine.scope(scope(h))
            assert mutation_bucket(q).tokens("ANONYMOUS", "c", now[0]) == -11
            c.close()
    run(scenario())


def test_delete_topics_by_id_are_charged() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, quotas=MUTATION_QUOTA) as h:
            now = freeze(h)
            c = await connect(h)
            cls: Any = DeleteTopicsRequest
            request = cls(version=6, timeout_ms=1000, topics=[
                cls.DeleteTopicState(name=None, topic_id=uuid.UUID(int=i)) for i in range(1, 13)])
            response = await c.call(request)
            assert [t.error_code for t in response.responses] == [0] * 12
            # Partition counts by id are unknown to the proxy: one permit per topic, as for a name
            # it has not seen in a Metadata response.
            q = h.proxy.engine.scope(scope(h))
            assert mutation_bucket(q).tokens("ANONYMOUS", "c", now[0]) == 1100 - 12
            c.close()
    run(scenario())


# --- connections --------------------------------------------------------------------------------

def test_connections_over_the_ip_creation_rate_are_closed_unserved() -> None:
    async def scenario() -> None:
        # window_num 2: a fresh window is 1 s, so 10/s admits 10 connections at one instant.
        async with running(quota={"window_num": 2},
                           quotas=[{"ip": "<default>", "connection_creation_rate": 10}]) as h:
            freeze(h)
            clients: list[Client] = []
            for _ in range(12):  # one at a time, so the proxy admits them in this order
                clients.append(await connect(h))
                await h.wait_for(lambda: metric(
                    h, "kafka_quota_proxy_connections_accepted_total") == len(clients))
            for c in clients:
                await c.send(list_groups(0))
            served = [correlation_id(await read_frame(c.reader)) for c in clients[:10]]
            assert served == [1] * 10
            for c in clients[10:]:
                assert await is_closed(c.reader)
            assert len(h.broker.client_conns()) == 10
            assert len(broker_frames(h)) == 10
            # Each refusal: rate 11/s against 10/s -> (11-10)/10 * 1000 ms, and it is not counted.
            assert metric(h, "kafka_quota_proxy_connection_accept_throttle_time_ms_total",
                          ip="127.0.0.1") == 200
            assert h.proxy.engine.connections.measure("127.0.0.1", START_MS) == 10.0
            for c in clients:
                c.close()
    run(scenario())


def test_max_connections_per_ip_closes_the_excess_at_once() -> None:
    async def scenario() -> None:
        async with running(quota={"max_connections_per_ip": 2}) as h:
            first, second = await connect(h), await connect(h)
            third = await connect(h)
            await third.send(list_groups(0))
            assert await is_closed(third.reader)
            assert (await first.call(list_groups(0))) is not None
            assert (await second.call(list_groups(0))) is not None
            assert len(broker_frames(h)) == 2
            first.close()
            await h.wait_for(lambda: len(h.proxy.connections) == 1)
            fourth = await connect(h)  # a slot is free again
            assert (await fourth.call(list_groups(0))) is not None
            second.close()
            fourth.close()
    run(scenario())
