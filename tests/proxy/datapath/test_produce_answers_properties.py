"""Every Produce answer a client gets through the proxy is the broker's answer to that very
request: its correlation id, in request order, its topics and partitions, and the base offsets
the broker gave that request's records. Drawn: 2-4 connections under one client-id, each
pipelining Produce requests (1-3 partitions, acks 0, 1 or -1, several versions), some closing
abruptly with requests in flight, the entity's producer_byte_rate none, Kafka's (throttled,
muted) or paced (held unread); a broker that answers each request after its own delay, out of
arrival order across connections, in order on each, sometimes with a throttle of its own.

The demo once reported acknowledged records missing; this shows the proxy never hands a client
an answer that is not the broker's to that request. Each partition's records carry a fingerprint
(connection, request, partition) by which the broker's log is looked up.

The quota engine's clock runs SPEED times the event loop's (a fake clock, as in
test_paced_quotas.py, that moves by itself): a paced wait is taken in real time and then asked
again, so the turn has come by then; a mute takes real time, so the quota is drawn near what a
scenario sends, and throttles stay tens of milliseconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from kafka_quota_proxy.protocol.headers import RequestHeader
from kafka_quota_proxy.protocol.produce import produce_acks
from kafka_quota_proxy.proxy.context import RequestContext
from tests.proxy.conftest import correlation_id, running
from tests.proxy.quota_support import START_MS, Client, connect, run, scope
from tests.support.fake_broker import BrokerConn
from tests.support.managers import produce_bytes

SPEED = 5  # quota-clock milliseconds per event-loop millisecond
TOPICS = ("orders", "audit")
VERSIONS = (3, 7, 9, 11)  # magic-2 era, before and after flexible versions, node_endpoints (v10+)


@dataclass(frozen=True, slots=True)
class Request:
    parts: tuple[tuple[str, int, int], ...]  # (topic, partition, bytes of records)
    acks: int
    delay_ms: int  # how long the broker takes to answer it
    broker_throttle_ms: int  # the throttle_time_ms the broker answers with


@dataclass(frozen=True, slots=True)
class Connection:
    version: int
    requests: tuple[Request, ...]
    depth: int  # requests in flight before the client reads an answer
    close_after: int | None  # abruptly closed after sending this many requests
    reset: bool  # closed with a TCP reset rather than a FIN


@dataclass(frozen=True, slots=True)
class Scenario:
    enforcement: str  # "none", "kafka" or "paced"
    connections: tuple[Connection, ...]
    # producer_byte_rate, in multiples of all the bytes the scenario sends. Its 1 s allowance is
    # spent before the scenario starts, so each connection's first request is over the quota,
    # by at most 1/quota_over_sent s.
    quota_over_sent: int


requests = st.builds(
    Request,
    parts=st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 3)), min_size=1, max_size=3,
                   unique=True).flatmap(lambda tps: st.tuples(*(
                       st.tuples(st.just(t), st.just(p), st.integers(40, 6000)) for t, p in tps))),
    acks=st.sampled_from((1, -1, -1, 0)),
    delay_ms=st.sampled_from((0, 0, 1, 4, 15)),
    broker_throttle_ms=st.sampled_from((0, 0, 0, 5, 250)),
)


@st.composite
def connections(draw: st.DrawFn) -> Connection:
    sent = draw(st.lists(requests, min_size=1, max_size=6))
    close_after = draw(st.none() | st.integers(1, len(sent)))
    return Connection(draw(st.sampled_from(VERSIONS)), tuple(sent), draw(st.integers(1, 3)),
                      close_after, draw(st.booleans()))


def scenarios(enforcement: str) -> st.SearchStrategy[Scenario]:
    return st.builds(Scenario, st.just(enforcement),
                     st.lists(connections(), min_size=2, max_size=4).map(tuple), st.sampled_from((4, 10, 25)))


def fingerprint(conn: int, request: int, part: int) -> bytes:
    return b"fp:%d.%d.%d|" % (conn, request, part)


def parse_fingerprint(records: bytes) -> tuple[int, int, int]:
    conn, request, part = records[3:records.index(b"|")].split(b".")
    return int(conn), int(request), int(part)


def produce_request(conn: int, index: int, version: int, request: Request) -> Any:
    """The request, each partition's records its fingerprint and filler up to its size."""
    topic = ProduceRequest.TopicProduceData
    by_topic: dict[str, list[Any]] = {}
    for n, (name, partition, size) in enumerate(request.parts):
        records = fingerprint(conn, index, n).ljust(size, b"x")
        by_topic.setdefault(name, []).append(topic.PartitionProduceData(index=partition, records=records))
    return ProduceRequest(version=version, transactional_id=None, acks=request.acks, timeout_ms=1000,
                          topic_data=[topic(name=name, partition_data=parts)
                                      for name, parts in by_topic.items()])


@dataclass(slots=True)
class Landed:
    """What the broker made of one partition's records: where they came and the offset it gave."""

    broker_conn: int
    correlation_id: int
    topic: str
    partition: int
    base_offset: int


@dataclass
class Broker:
    """A broker that appends each partition's records at its own offset counter and answers
    with exactly the partitions asked, after the delay the scenario gave that request."""

    scenario: Scenario
    log: dict[tuple[int, int, int], Landed] = field(default_factory=dict)
    offsets: Counter[tuple[str, int]] = field(default_factory=Counter)
    conns: dict[int, int] = field(default_factory=dict)  # id(BrokerConn) -> its number
    arrived: list[tuple[int, int]] = field(default_factory=list)  # (conn, request) in order
    answered: list[tuple[int, int]] = field(default_factory=list)

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        assert header.api_key == 0, header
        v = header.api_version
        request: Any = ProduceRequest.decode(frame[header.body_offset:], version=v)
        number = self.conns.setdefault(id(conn), len(self.conns))
        topic = ProduceResponse.TopicProduceResponse
        answer: list[Any] = []
        key = None
        for t in request.topic_data:
            parts = []
            for p in t.partition_data:
                records = bytes(p.records)
                key = parse_fingerprint(records)
                base = self.offsets[t.name, p.index]
                self.offsets[t.name, p.index] += 1 + len(records) // 512  # its record count
                assert key not in self.log, f"records {key} appended twice"
                self.log[key] = Landed(number, header.correlation_id, t.name, p.index, base)
                parts.append(topic.PartitionProduceResponse(
                    index=p.index, error_code=0, base_offset=base, log_append_time_ms=-1,
                    log_start_offset=0, record_errors=[], error_message=None))
            answer.append(topic(name=t.name, partition_responses=parts))
        assert key is not None
        self.arrived.append(key[:2])
        if produce_acks(memoryview(frame), header.body_offset, v) == 0:
            return None
        planned = self.scenario.connections[key[0]].requests[key[1]]
        if planned.delay_ms:
            await asyncio.sleep(planned.delay_ms / 1000)
        self.answered.append(key[:2])
        return bytes(ProduceResponse(version=v, throttle_time_ms=planned.broker_throttle_ms,
                                     responses=answer, node_endpoints=[]).encode(version=v))


@dataclass
class Seen:
    """What a run exercised, so that the property cannot pass without holds, throttles and
    closes having happened."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] += n


async def client(c: Client, number: int, plan: Connection, broker: Broker, seen: Seen,
                 paths: dict[int, int], no_quota: bool) -> None:
    """Send the plan's requests, `depth` at a time, and check every answer as it comes."""
    waiting: list[tuple[int, int, Any]] = []  # (correlation id, request index, message) sent, unanswered

    async def answer() -> None:
        corr, index, msg = waiting.pop(0)
        raw, response = await c.recv(msg)
        planned = plan.requests[index]
        assert correlation_id(raw) == corr, (number, index, correlation_id(raw), corr)
        got = [(t.name, p.index) for t in response.responses for p in t.partition_responses]
        asked = [(t.name, p.index) for t in msg.topic_data for p in t.partition_data]
        assert got == asked, (number, index, got, asked)
        numbers = {(name, partition): n for n, (name, partition, _) in enumerate(planned.parts)}
        for t in response.responses:
            for p in t.partition_responses:
                n = numbers[t.name, p.index]
                landed = broker.log.get((number, index, n))
                assert landed is not None, f"answered, but the broker never got {number}.{index}.{n}"
                assert (landed.topic, landed.partition) == (t.name, p.index)
                assert landed.correlation_id == corr, (number, index, landed, corr)
                assert p.base_offset == landed.base_offset, (number, index, n, p.base_offset, landed)
                assert p.error_code == 0
                # One upstream connection per client connection, never shared.
                assert paths.setdefault(number, landed.broker_conn) == landed.broker_conn
        assert response.throttle_time_ms >= planned.broker_throttle_ms
        if no_quota:
            assert response.throttle_time_ms == planned.broker_throttle_ms
        seen.add("answered")
        seen.add("throttled by the proxy", response.throttle_time_ms > planned.broker_throttle_ms)

    for index, planned in enumerate(plan.requests):
        msg = produce_request(number, index, plan.version, planned)
        corr = await c.send(msg)
        if planned.acks != 0:
            waiting.append((corr, index, msg))
        if plan.close_after == index + 1:
            seen.add("closed with answers due", bool(waiting))
            if plan.reset:
                c.writer.transport.abort()
            else:
                c.close()
            return
        while len(waiting) >= plan.depth:
            await answer()
    while waiting:
        await answer()
    c.close()


async def play(scenario: Scenario, seen: Seen) -> None:
    broker = Broker(scenario)
    sizes = [len(produce_request(i, j, c.version, r).encode(version=c.version))
             for i, c in enumerate(scenario.connections) for j, r in enumerate(c.requests)]
    rate = sum(sizes) * scenario.quota_over_sent
    config: dict[str, Any] = {}
    if scenario.enforcement != "none":
        config = {"quota": {"window_num": 2, "byte_rate_enforcement": scenario.enforcement},
                  "quotas": [{"client-id": "c", "producer_byte_rate": rate}]}
    async with running(broker, **config) as h:
        loop = asyncio.get_running_loop()
        start = loop.time()
        h.proxy.engine.clock = lambda: START_MS + int((loop.time() - start) * 1000 * SPEED)
        if scenario.enforcement != "none":
            # Another client of the entity has just spent its allowance (window_num 2: 1 s).
            produce_bytes(h.proxy.engine.scope(scope(h))).record_and_get_throttle_ms(
                "ANONYMOUS", "c", rate, START_MS, paced=scenario.enforcement == "paced")
        (charge,) = h.proxy.pipeline.request_holds(0)
        asked = charge.hold_ms

        def hold_ms(ctx: RequestContext) -> int:
            wait = asked(ctx)
            seen.add("held for a paced turn", wait > 0)
            return wait
        charge.hold_ms = hold_ms  # type: ignore[method-assign]
        clients = [await connect(h) for _ in scenario.connections]
        paths: dict[int, int] = {}
        plans = zip(clients, scenario.connections, strict=True)
        await asyncio.gather(*(client(c, n, plan, broker, seen, paths, scenario.enforcement == "none")
                               for n, (c, plan) in enumerate(plans)))
        assert len(set(paths.values())) == len(paths)
    answered = set(broker.answered)
    seen.add("answered out of arrival order", broker.answered != [k for k in broker.arrived if k in answered])
    seen.add("broker's own throttle",
             any(r.broker_throttle_ms for c in scenario.connections for r in c.requests))


# What each quota must have exercised over a run (the examples of one test), besides the
# broker's own ways: answers out of arrival order, its throttles, and closes with answers due.
EXERCISED = {"none": (), "kafka": ("throttled by the proxy",),
             "paced": ("held for a paced turn", "throttled by the proxy")}


@pytest.mark.parametrize("enforcement", ["none", "kafka", "paced"])
def test_every_produce_answer_is_the_brokers_answer_to_that_request(enforcement: str) -> None:
    seen = Seen()

    @given(scenarios(enforcement))
    def check(scenario: Scenario) -> None:
        run(play(scenario, seen))

    check()
    for what in ("closed with answers due", "answered out of arrival order", "broker's own throttle",
                 *EXERCISED[enforcement]):
        assert seen.counts[what], f"never {what}: {dict(seen.counts)}"
