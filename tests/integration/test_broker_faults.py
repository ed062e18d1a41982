"""Broker faults under load (docs/reliability.md, "Broker faults under load"): Tansu storing in
S3 (SeaweedFS), a fault-injecting relay in front of it, the proxy in front of that, and an
idempotent librdkafka producer and a consumer group through the proxy. The short version of
`make faults-broker`; the harness is devkit/broker_faults.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from devkit.broker_faults import (
    CUT,
    KILL,
    SIGSTOP,
    Stack,
    create_topic,
    read_back,
    run_faults,
    running_stack,
    table,
)
from devkit.broker_faults_load import Delivery

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack() as s:
        yield s


def test_tansu_on_s3_keeps_every_record_across_kill_9(stack: Stack) -> None:
    topic = f"s3-{uuid.uuid4().hex[:8]}"
    create_topic(stack.broker.address, topic, 1)
    acked: list[Delivery] = []
    errors = []

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            acked.append(Delivery(int(msg.value()), msg.partition(), msg.offset(), time.monotonic()))  # type: ignore[attr-defined]
        else:
            errors.append(err)

    producer = Producer({"bootstrap.servers": stack.broker.address, "acks": "all", "linger.ms": 5})
    for i in range(5000):
        producer.produce(topic, value=b"%d" % i, partition=0, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    del producer
    assert errors == [] and len(acked) == 5000

    stack.broker.kill()
    stack.broker.restart()

    records = read_back(stack.broker.address, topic, 1, acked)
    assert [seq for _, seq in records[0]] == list(range(5000))
    assert [offset for offset, _ in records[0]] == list(range(5000))


def test_faults_under_load_through_the_proxy(stack: Stack) -> None:
    run = run_faults(stack, [CUT, SIGSTOP, KILL], rate=200, partitions=3,
                     seconds_before=2, seconds_after=4)
    print("\n" + table([run]))
    assert [f.fault for f in run.faults] == [CUT.name, SIGSTOP.name, KILL.name]
    assert run.produced > 200 * 20 and run.failed == 0 and run.flush_left == 0
    assert run.acked == run.produced
    # Exactly once and in order per partition.
    assert run.duplicates == 0
    assert run.out_of_order == 0
    # Every acknowledged record is at the broker, except those Tansu itself acknowledged as
    # duplicates of a batch it lost in the kill -9 (it does the same without the proxy:
    # `make faults-broker`'s direct rows); the proxy passes Produce responses through unchanged.
    assert run.acked_missing == run.missing_acked_by_broker_as_duplicate
    assert run.at_broker == run.acked - run.acked_missing + run.unacked_at_broker
    # The group read every acknowledged record that is at the broker.
    assert run.consumed == run.consumer_expected == run.acked - run.acked_missing
    for fault in run.faults:
        assert fault.recover_seconds is not None, fault
        assert fault.connections_ok, fault  # client-held = proxy-open = proxy-upstream
    assert run.connections_after_close == 0
    assert run.proxy_same_process
    assert run.problems == []
