"""The producer-id quota (KIP-936) with real idempotent producers (confluent-kafka) through the
proxy to Tansu. Two users authenticate to the proxy (SASL PLAIN, terminated by the proxy):
`flood` makes a new idempotent producer for every message, as a misconfigured application
does; `steady` runs three long-lived idempotent producers the whole time. Both fall under the
same `<default>` user quota.

Windows are shortened to 60 s (11 samples), so a fresh window is 600 s and a quota of
0.01 ids/s lets 6 new ids through; each id over costs 1/Q = 100 s of throttle. The cache keeps
an id for 60 to 90 s: the steady producers count once in a test shorter than that."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.processes import ProxyProcess
from devkit.tansu import Broker
from kafka_quota_proxy.config.credentials_file import save_credentials
from kafka_quota_proxy.identity.credentials import CredentialStore

pytestmark = pytest.mark.integration

QUOTA = 0.01
ALLOWED = 6  # QUOTA * (11 - 1) * 60 s
FLOOD = 14  # producers the flood user makes, one message each
PASSWORDS = {"flood": "flood-Secret-1", "steady": "steady-Secret-1"}


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pid") / "users.yaml"
    store = CredentialStore()
    for user, password in PASSWORDS.items():
        store.add(user, password, ["PLAIN"])
    save_credentials(store, path)
    return path


def _proxy(broker: Broker, node_id: int, users: Path, action: str) -> ProxyProcess:
    return ProxyProcess(broker.address, node_id, extra_config={
        "sasl": {"mode": "terminate", "credentials_file": str(users)},
        "quota": {"producer_ids": {"action": action, "window_size_seconds": 60}},
        "quotas": [{"user": "<default>", "producer_ids_rate": QUOTA}]}).start()


@pytest.fixture(scope="module")
def throttling(broker: Broker, broker_node_id: int, users_file: Path) -> Iterator[ProxyProcess]:
    p = _proxy(broker, broker_node_id, users_file, "throttle")
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def rejecting(broker: Broker, broker_node_id: int, users_file: Path) -> Iterator[ProxyProcess]:
    p = _proxy(broker, broker_node_id, users_file, "reject")
    try:
        yield p
    finally:
        p.stop()


def _conf(proxy: ProxyProcess, user: str) -> dict[str, Any]:
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": PASSWORDS[user]}


class Steady:
    """Three long-lived idempotent producers sending a numbered message every 20 ms each."""

    def __init__(self, proxy: ProxyProcess, topic: str) -> None:
        self.producers = [Producer({**_conf(proxy, "steady"), "enable.idempotence": True, "linger.ms": 5,
                                    "statistics.interval.ms": 200, "stats_cb": self._stats})
                          for _ in range(3)]
        self.topic = topic
        self.sent = 0
        self.delivered: list[bytes] = []
        self.errors: list[Any] = []
        self.throttle_max_ms = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _stats(self, text: str) -> None:
        for b in json.loads(text)["brokers"].values():
            if b.get("nodeid", -1) >= 0:
                self.throttle_max_ms = max(self.throttle_max_ms, b["throttle"]["max"])

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered.append(msg.value())

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, p in enumerate(self.producers):
                p.produce(self.topic, b"steady-%d-%d" % (i, self.sent), on_delivery=self._delivered)
                p.poll(0)
            self.sent += 1
            time.sleep(0.02)
        for p in self.producers:
            p.flush(30)

    def __enter__(self) -> Steady:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def _flood(proxy: ProxyProcess, topic: str) -> list[tuple[int, int]]:
    """FLOOD fresh idempotent producers, one message each: (error code or 0, max throttle ms)."""
    return [_one_flood_producer(proxy, topic, i) for i in range(FLOOD)]


def _one_flood_producer(proxy: ProxyProcess, topic: str, i: int) -> tuple[int, int]:
    got: list[Any] = []
    throttle = [0]

    def stats(text: str) -> None:
        for b in json.loads(text)["brokers"].values():
            if b.get("nodeid", -1) >= 0:
                throttle[0] = max(throttle[0], b["throttle"]["max"])

    p = Producer({**_conf(proxy, "flood"), "enable.idempotence": True, "linger.ms": 0,
                  "statistics.interval.ms": 100, "stats_cb": stats})
    p.produce(topic, b"flood-%d" % i, on_delivery=lambda err, msg: got.append(err))
    assert p.flush(30) == 0
    time.sleep(0.25)  # one more statistics callback, carrying the response's throttle
    p.poll(0)
    (err,) = got
    return (err.code() if err is not None else 0, throttle[0])


def _topic(proxy: ProxyProcess, name: str) -> None:
    admin = AdminClient(_conf(proxy, "steady"))
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)


def _read_back(broker: Broker, topic: str, expect: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": broker.address, "group.id": "check", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < expect and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    # One more poll: nothing beyond what was expected.
    m = c.poll(1.0)
    if m is not None and m.error() is None:
        got.append(m.value())
    c.close()
    return got


def _scope(proxy: ProxyProcess) -> str:
    return f"127.0.0.1:{proxy.upstream.rsplit(':', 1)[1]}"


def test_throttle_reports_the_flood_and_leaves_the_steady_user_alone(throttling: ProxyProcess,
                                                                      topic_name: str) -> None:
    _topic(throttling, topic_name)
    with Steady(throttling, topic_name) as steady:
        time.sleep(1.0)
        outcomes = _flood(throttling, topic_name)
    print(f"throttle: flood outcomes {outcomes}; steady sent {3 * steady.sent}, "
          f"delivered {len(steady.delivered)}, throttle max {steady.throttle_max_ms} ms")
    assert [code for code, _ in outcomes] == [0] * FLOOD  # delivered: throttled, not refused
    # Kafka's throttle for the n-th new id is n/Q - window: the window is 600 s plus the time
    # since the first id (e, under a minute here), so the 7th costs 100 s - e, and each id
    # after it 100 s more.
    throttles = [ms for _, ms in outcomes]
    assert throttles[:ALLOWED] == [0] * ALLOWED
    for n, ms in enumerate(throttles[ALLOWED:], start=1):
        assert 100_000 * n - 60_000 < ms <= 100_000 * n
    assert steady.errors == [] and steady.throttle_max_ms == 0
    assert len(steady.delivered) == 3 * steady.sent
    scope = _scope(throttling)
    assert throttling.metric("kafka_quota_proxy_producer_ids_tracked", scope=scope, user="flood") == FLOOD
    assert throttling.metric("kafka_quota_proxy_producer_ids_tracked", scope=scope, user="steady") == 3
    assert throttling.metric("kafka_quota_proxy_throttle_time_ms_total", quota_type="producer_ids",
                             user="flood", client_id="") == sum(ms for _, ms in outcomes)
    assert throttling.metric("kafka_quota_proxy_throttled_requests_total", quota_type="producer_ids",
                             user="steady", client_id="") == 0


def test_reject_refuses_the_flood_and_leaves_the_steady_user_alone(rejecting: ProxyProcess, broker: Broker,
                                                                    topic_name: str) -> None:
    _topic(rejecting, topic_name)
    with Steady(rejecting, topic_name) as steady:
        time.sleep(1.0)
        outcomes = _flood(rejecting, topic_name)
    print(f"reject: flood outcomes {outcomes}; steady sent {3 * steady.sent}, "
          f"delivered {len(steady.delivered)}, throttle max {steady.throttle_max_ms} ms")
    refused = KafkaError.THROTTLING_QUOTA_EXCEEDED
    # librdkafka fails a Produce error it does not know at once, without retrying.
    assert [code for code, _ in outcomes] == [0] * ALLOWED + [refused] * (FLOOD - ALLOWED)
    # Each refusal carries what counting the id would have cost, 100 s - e: nothing refused
    # was counted, so the refusals do not add up.
    assert all(40_000 < ms <= 100_000 for _, ms in outcomes[ALLOWED:])
    assert steady.errors == [] and steady.throttle_max_ms == 0
    assert len(steady.delivered) == 3 * steady.sent
    # The broker holds the flood's first ALLOWED messages and every steady one: nothing refused
    # reached it.
    stored = _read_back(broker, topic_name, ALLOWED + 3 * steady.sent)
    flood = sorted(v for v in stored if v.startswith(b"flood-"))
    assert flood == sorted(b"flood-%d" % i for i in range(ALLOWED))
    assert sorted(v for v in stored if v.startswith(b"steady-")) == sorted(steady.delivered)
    scope = _scope(rejecting)
    assert rejecting.metric("kafka_quota_proxy_producer_id_rejections_total", scope=scope,
                            user="flood") == FLOOD - ALLOWED
    assert rejecting.metric("kafka_quota_proxy_producer_ids_tracked", scope=scope, user="flood") == ALLOWED
    assert rejecting.metric("kafka_quota_proxy_producer_ids_tracked", scope=scope, user="steady") == 3
