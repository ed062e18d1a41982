"""SIGTERM or kill -9 of a real proxy process while the workload runs, then the same proxy
started again on the same ports; the figures of each round and the check at the broker."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from devkit.processes import ProxyProcess
from devkit.proxy_faults.workload import (
    NumberedProducer,
    Reader,
    Verdict,
    check,
    create_topic,
    read_from_broker,
)
from devkit.tansu import Broker

FAULTS = ("sigterm", "kill")


@dataclass(slots=True)
class Round:
    """One fault and the recovery from it (seconds; counts of records)."""

    in_flight: int  # sent and not yet acknowledged when the signal went
    exit_seconds: float  # signal to the process's exit (SIGTERM: the drain)
    exit_status: int
    down_seconds: float  # signal to the new proxy listening
    reconnect_seconds: float  # new proxy listening to the producer's next acknowledgement
    read_again_seconds: float  # new proxy listening to the consumer's next record


@dataclass
class FaultRun:
    fault: str
    rate: float
    rounds: list[Round] = field(default_factory=list)
    sent: int = 0
    undecided: int = 0  # records whose outcome flush() did not learn
    failures: list[tuple[int, str]] = field(default_factory=list)
    verdict: Verdict | None = None
    reader_missing: int = 0  # acknowledged records the consumer through the proxy never read
    reader_duplicates: int = 0
    proxy_logs: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (self.verdict is not None and self.verdict.clean and not self.failures
                and self.undecided == 0 and self.reader_missing == 0)


def _wait_for(predicate: object, timeout: float) -> float:
    """Seconds until `predicate()` holds; inf if it does not within `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
        time.sleep(0.01)
    return float("inf")


def run(broker: Broker, node_id: int, fault: str, *, rounds: int = 1, rate: float = 2000,
        partitions: int = 3, warmup: float = 2.0, pause: float = 3.0, between: float = 2.0,
        recover_timeout: float = 60.0) -> FaultRun:
    """`rounds` faults of one kind under load, `pause` seconds down each time (kill -9; a SIGTERM
    waits for the drain, then `pause`), `between` seconds of load after each recovery."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}")
    topic = f"pf-{fault}-{uuid.uuid4().hex[:8]}"
    create_topic(broker.address, topic, partitions)
    proxy = ProxyProcess(broker.address, node_id).start()
    result = FaultRun(fault, rate)
    producer = NumberedProducer(proxy.bootstrap, topic, partitions, rate).start()
    reader = Reader(proxy.bootstrap, topic, partitions).start()
    try:
        time.sleep(warmup)
        for _ in range(rounds):
            proxy = _one_round(broker, node_id, proxy, fault, producer, reader, result, pause,
                               recover_timeout)
            time.sleep(between)
        result.undecided = producer.stop()
        result.sent = producer.sent
        result.failures = list(producer.failures)
        acked = {a.value for a in producer.acks}
        result.reader_missing = len(reader.wait_for(acked, timeout=30))
        result.reader_duplicates = sum(len(vs) - len(set(vs)) for vs in reader.seen.values())
    finally:
        reader.stop()
        result.proxy_logs.append(proxy.log_text())
        proxy.stop()
    result.verdict = check(producer.acks, read_from_broker(broker.address, topic, partitions))
    return result


def _one_round(broker: Broker, node_id: int, proxy: ProxyProcess, fault: str,
               producer: NumberedProducer, reader: Reader, result: FaultRun, pause: float,
               recover_timeout: float) -> ProxyProcess:
    assert proxy.proc is not None
    in_flight = producer.in_flight()
    signalled = time.monotonic()
    if fault == "sigterm":
        proxy.proc.terminate()
        status = proxy.proc.wait(60)
        exited = time.monotonic() - signalled
        time.sleep(pause)
    else:
        proxy.proc.kill()
        status = proxy.proc.wait(10)
        exited = time.monotonic() - signalled
        time.sleep(max(0.0, pause - exited))
    result.proxy_logs.append(proxy.log_text())
    acks_before, read_before = len(producer.acks), reader.count()
    again = ProxyProcess(broker.address, node_id, port=proxy.port, node_port=proxy.node_port,
                         metrics_port=proxy.metrics_port).start()
    listening = time.monotonic()
    _wait_for(lambda: len(producer.acks) > acks_before and reader.count() > read_before,
              recover_timeout)
    reconnect = producer.acks[acks_before].at - listening if len(producer.acks) > acks_before \
        else float("inf")
    read_again = reader.read_at[read_before] - listening if reader.count() > read_before \
        else float("inf")
    result.rounds.append(Round(in_flight, exited, status, listening - signalled,
                               reconnect, read_again))
    return again
