"""Broker faults under load, through the proxy: the harness behind tests/integration/
test_broker_faults.py and `make faults-broker` (docs/reliability.md, "Broker faults under load").

The stack: SeaweedFS (S3) <- Tansu storing there <- a fault-injecting relay <- the proxy <- the
clients. Tansu advertises the relay, so every proxy-to-broker connection passes through it.
The load: an idempotent librdkafka producer (acks=all) sends numbered records, record i to
partition i % partitions, while a consumer group reads them, both through the proxy. One fault
is injected mid-run; then the producer stops and flushes, and the whole topic is read back with
a fresh consumer from the broker and compared with what was acknowledged.

    python -m devkit.broker_faults --records-per-second 500 --seconds-after 20 --repeat 3
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devkit.broker_faults_load import Delivery, Load
from devkit.processes import ProxyProcess
from devkit.relay import Relay
from devkit.s3 import SeaweedS3
from devkit.tansu import Broker

OPEN_CONNECTIONS = "kafka_quota_proxy_connections_open"
ACCEPTED_CONNECTIONS = "kafka_quota_proxy_connections_accepted_total"


@dataclass
class Stack:
    """S3, a Tansu broker storing there, a relay in front of the broker, and the proxy."""

    s3: SeaweedS3
    broker: Broker
    relay: Relay
    proxy: ProxyProcess

    def direct_bootstrap(self) -> str:
        """The broker itself (its Metadata then names the relay, which passes bytes through)."""
        return self.broker.address


@contextmanager
def running_stack() -> Iterator[Stack]:
    s3 = SeaweedS3().start()
    relay = broker = proxy = None
    try:
        broker = Broker(storage=s3.storage())
        relay = Relay(broker.port).start()
        broker.advertised = relay.address
        broker.start()
        node_id = broker.node_id()
        proxy = ProxyProcess(relay.address, node_id).start()
        yield Stack(s3, broker, relay, proxy)
    finally:
        for part in (proxy, relay, broker):
            if part is not None:
                part.stop()
        s3.stop()


# -- the faults ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Fault:
    """A fault: its name for the table, and what injects it (returns when the fault has ended)."""

    name: str
    inject: Callable[[Stack], None]


def _kill_and_restart(stack: Stack, down_seconds: float = 2.0) -> None:
    stack.broker.kill()
    time.sleep(down_seconds)
    stack.broker.restart()


def _stop_and_continue(stack: Stack, seconds: float = 10.0) -> None:
    stack.broker.pause()
    try:
        time.sleep(seconds)
    finally:
        stack.broker.resume()


def _cut(stack: Stack) -> None:
    stack.relay.cut()


def _blackhole(stack: Stack, seconds: float = 10.0) -> None:
    stack.relay.blackhole(seconds)
    time.sleep(seconds)


KILL = Fault("kill -9, restart after 2 s", _kill_and_restart)
SIGSTOP = Fault("SIGSTOP 10 s, SIGCONT", _stop_and_continue)
CUT = Fault("relay: RST every proxy-broker connection", _cut)
BLACKHOLE = Fault("relay: blackhole 10 s", _blackhole)
FAULTS = {"kill": KILL, "sigstop": SIGSTOP, "cut": CUT, "blackhole": BLACKHOLE}


# -- the load --------------------------------------------------------------------------------------


# -- reading back and checking ---------------------------------------------------------------------

def read_back(bootstrap: str, topic: str, partitions: int, acked: list[Delivery],
              timeout: float = 60, quiet: float = 2.0) -> dict[int, list[tuple[int, int]]]:
    """Every record of `topic`, per partition, as (offset, seq), read from the beginning by a
    consumer of its own: at least up to the high watermark and past the highest acknowledged
    offset, then until nothing more comes for `quiet` seconds.

    Not up to the high watermark alone: Tansu on S3 (0.6.0) reports one that lags the records
    it has acknowledged, and stored, by up to a second of them; a Fetch returns them all."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"readback-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)}
        for d in acked:
            if d.offset is not None and d.offset >= 0:
                ends[d.partition] = max(ends[d.partition], d.offset + 1)
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records: dict[int, list[tuple[int, int]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + timeout
        last = time.monotonic()

        def short() -> bool:
            return any((records[p][-1][0] + 1 if records[p] else 0) < ends[p] for p in records)

        while short() or time.monotonic() - last < quiet:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read back {sum(map(len, records.values()))} records of {topic}, "
                                   f"short of the offsets {ends}")
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            last = time.monotonic()
            records[msg.partition()].append((msg.offset(), int(msg.value()[:12])))  # type: ignore[index,arg-type]
        return records
    finally:
        consumer.close()


@dataclass
class FaultFigures:
    """What one fault did to the load: measured while it ran."""

    fault: str
    in_flight: int  # produced, not yet acknowledged, when the fault began
    recover_seconds: float | None  # from the fault's end to the first delivery after it
    connections: str = ""  # "client-held = proxy-open = proxy-upstream" once settled after it
    connections_ok: bool = True
    # Client connections the proxy accepted from the fault's start until seconds_after its end:
    # the clients' reconnects (a handful without a fault).
    accepted: int | None = None


@dataclass
class Run:
    """One load with one or more faults in turn, measured and checked at the end."""

    through_proxy: bool
    records_per_second: float
    partitions: int
    faults: list[FaultFigures] = field(default_factory=list)
    produced: int = 0
    acked: int = 0
    failed: int = 0
    at_broker: int = 0
    duplicates: int = 0  # records at the broker more than once
    out_of_order: int = 0  # records after a higher number in the same partition
    # Acknowledged with an offset that does not hold them: Tansu answers a retried batch it has
    # seen before with DuplicateSequenceNumber and base offset -1, so librdkafka reports offsets
    # -1, 0, 1, ... for it (a Kafka broker returns the batch's first offset).
    acked_without_offset: int = 0
    acked_missing: int = 0  # acknowledged, not at the broker
    # Of those, the ones the broker acknowledged without an offset: after a kill -9, Tansu on
    # S3 answers DuplicateSequenceNumber for a batch it no longer holds (the proxy passes
    # Produce responses through unchanged, and the same happens without it: `--direct`).
    missing_acked_by_broker_as_duplicate: int = 0
    unacked_at_broker: int = 0  # at the broker with no acknowledgement (allowed once)
    consumer_expected: int = 0  # acknowledged records at the broker
    consumed: int = 0  # of those, the ones the consumer group read
    flush_left: int | None = None  # records still queued after the producer's flush
    connections_after_close: float | None = None  # the proxy's open count once the clients closed
    proxy_same_process: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _client_held(ports: set[int]) -> int:
    """This process's established connections to the proxy's listeners (librdkafka's sockets)."""
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.raddr and c.raddr.port in ports and c.status == psutil.CONN_ESTABLISHED)


def _proxy_upstream(proxy_pid: int, relay_port: int) -> int:
    return sum(1 for c in psutil.Process(proxy_pid).net_connections("tcp")
               if c.raddr and c.raddr.port == relay_port and c.status == psutil.CONN_ESTABLISHED)


def connections_settle(stack: Stack, timeout: float = 60) -> tuple[bool, str]:
    """Wait until the proxy's open-connection gauge, its sockets to the broker and the clients'
    own sockets to the proxy agree: no connection left hanging on either side."""
    proxy = stack.proxy
    assert proxy.proc is not None
    ports = {proxy.port, proxy.node_port}
    deadline = time.monotonic() + timeout
    while True:
        held = _client_held(ports)
        open_ = proxy.metric(OPEN_CONNECTIONS)
        upstream = _proxy_upstream(proxy.proc.pid, stack.relay.port)
        seen = f"{held} = {open_:.0f} = {upstream}"
        if held == open_ == upstream and held == _client_held(ports):
            return True, seen
        if time.monotonic() > deadline:
            return False, seen
        time.sleep(0.5)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create `topic`; the admin client (and its connections) ends with this call."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)


def run_faults(stack: Stack, faults: list[Fault], *, rate: float = 200, partitions: int = 3,
               seconds_before: float = 3, seconds_after: float = 5, through_proxy: bool = True,
               consumer_timeout: float = 120) -> Run:
    """Faults in turn under one load on a new topic, through the proxy (or straight to the
    broker, without a consumer group, with `through_proxy=False`); measured and checked."""
    proxy = stack.proxy
    assert proxy.proc is not None
    pid = proxy.proc.pid
    bootstrap = proxy.bootstrap if through_proxy else stack.direct_bootstrap()
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    run = Run(through_proxy, rate, partitions)
    load = Load(bootstrap, topic, partitions, rate, group=through_proxy).start()
    # Steady state first: deliveries flowing and the group reading (Tansu's first join is slow).
    if not load.wait_acked(int(rate), 60):
        run.problems.append("no deliveries before the faults")
    if through_proxy and not load.wait_consumed({0}, 90):
        run.problems.append("the consumer group read nothing before the faults")
    for fault in faults:
        time.sleep(seconds_before)
        in_flight = load.in_flight()
        accepted = proxy.metric(ACCEPTED_CONNECTIONS) if through_proxy else 0.0
        fault.inject(stack)
        ended = time.monotonic()
        time.sleep(seconds_after)
        with load.lock:
            after = [d.at for d in load.acked if d.at >= ended]
        figures = FaultFigures(fault.name, in_flight, min(after) - ended if after else None)
        if through_proxy:
            figures.accepted = int(proxy.metric(ACCEPTED_CONNECTIONS) - accepted)
        if through_proxy:
            figures.connections_ok, figures.connections = connections_settle(stack)
        run.faults.append(figures)
    load.stop_producing()
    with load.lock:
        acked = list(load.acked)
        run.failed = len(load.failed)
        run.produced = load.produced
    run.acked, run.flush_left = len(acked), load.flush_left
    records = read_back(stack.direct_bootstrap(), topic, partitions, acked)
    at_broker = Counter(seq for recs in records.values() for _, seq in recs)
    where: dict[tuple[int, int | None], int] = {
        (p, off): seq for p, recs in records.items() for off, seq in recs}
    acked_seqs = {d.seq for d in acked}
    without_offset = {d.seq for d in acked if where.get((d.partition, d.offset)) != d.seq}
    missing = acked_seqs - at_broker.keys()
    run.at_broker = sum(at_broker.values())
    run.duplicates = sum(n - 1 for n in at_broker.values() if n > 1)
    run.out_of_order = sum(1 for recs in records.values()
                           for (_, a), (_, b) in zip(recs, recs[1:], strict=False) if b <= a)
    run.acked_without_offset = len(without_offset)
    run.acked_missing = len(missing)
    run.missing_acked_by_broker_as_duplicate = len(missing & without_offset)
    run.unacked_at_broker = len(at_broker.keys() - acked_seqs)
    expected = acked_seqs & at_broker.keys()
    run.consumer_expected = len(expected)
    if through_proxy:
        if not load.wait_consumed(expected, consumer_timeout):
            run.problems.append("the consumer group did not read every acknowledged record")
        with load.lock:
            run.consumed = len(load.consumed & expected)
    load.stop_consuming()
    if through_proxy:
        run.connections_after_close = _wait_gauge(proxy, 0, 30)
        run.proxy_same_process = proxy.proc.poll() is None and proxy.proc.pid == pid
    _judge(run, missing - without_offset)
    return run


def _judge(run: Run, missing_unexplained: set[int]) -> None:
    problems = run.problems
    if run.duplicates:
        problems.append(f"{run.duplicates} records at the broker more than once")
    if run.out_of_order:
        problems.append(f"{run.out_of_order} records out of order")
    if missing_unexplained:
        problems.append(f"{len(missing_unexplained)} acknowledged records not at the broker, "
                        f"first {min(missing_unexplained)}")
    if run.flush_left:
        problems.append(f"the producer's flush left {run.flush_left} records")
    if run.failed:
        problems.append(f"{run.failed} records failed")
    for f in run.faults:
        if f.recover_seconds is None:
            problems.append(f"{f.fault}: no delivery after the fault")
        if not f.connections_ok:
            problems.append(f"{f.fault}: connections did not settle (client-held = proxy-open = "
                            f"proxy-upstream: {f.connections})")
    if run.through_proxy:
        if run.connections_after_close != 0:
            problems.append(f"the proxy counts {run.connections_after_close} open connections "
                            "after the clients closed")
        if not run.proxy_same_process:
            problems.append("the proxy process is not the one that started")


def _wait_gauge(proxy: ProxyProcess, want: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        value = proxy.metric(OPEN_CONNECTIONS)
        if value == want or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


# -- the table -------------------------------------------------------------------------------------

HEADER = ("fault", "path", "load", "acked / produced", "at broker", "dup", "out of order",
          "acked, not at broker", "consumed", "recover s", "in flight", "connections", "reconnects")


def rows(run: Run) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for f in run.faults:
        recover = f"{f.recover_seconds:.2f}" if f.recover_seconds is not None else "never"
        lost = str(run.acked_missing)
        if run.missing_acked_by_broker_as_duplicate:
            lost += f" ({run.missing_acked_by_broker_as_duplicate} acked by Tansu as duplicates)"
        out.append((
            f.fault, "proxy" if run.through_proxy else "direct",
            f"{run.records_per_second:.0f}/s, {run.partitions} partitions",
            f"{run.acked} / {run.produced}", str(run.at_broker), str(run.duplicates),
            str(run.out_of_order), lost,
            f"{run.consumed} / {run.consumer_expected}" if run.through_proxy else "-",
            recover, str(f.in_flight),
            (("settled " if f.connections_ok else "HANGING ") + f.connections) if run.through_proxy else "-",
            str(f.accepted) if f.accepted is not None else "-"))
    return out


def table(runs: list[Run]) -> str:
    body = [HEADER, *(row for run in runs for row in rows(run))]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in body]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.broker_faults",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--faults", default="kill,sigstop,cut,blackhole",
                        help="comma-separated, of: " + ", ".join(FAULTS))
    parser.add_argument("--repeat", type=int, default=3, help="each fault this many times")
    parser.add_argument("--records-per-second", type=float, default=500)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--seconds-before", type=float, default=10)
    parser.add_argument("--seconds-after", type=float, default=20)
    parser.add_argument("--direct", action="store_true",
                        help="also run kill -9 straight to the broker, without the proxy, as a control")
    args = parser.parse_args(argv)
    faults = [FAULTS[name] for name in args.faults.split(",")]
    # A SIGTERM unwinds like Ctrl-C, so that the proxy process is stopped too (S3 and Tansu die
    # with this process anyway).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[Run] = []
    with running_stack() as stack:
        plan = [(fault, True) for _ in range(args.repeat) for fault in faults]
        if args.direct:
            plan += [(KILL, False)] * args.repeat
        for fault, through_proxy in plan:
            run = run_faults(stack, [fault], rate=args.records_per_second, partitions=args.partitions,
                             seconds_before=args.seconds_before, seconds_after=args.seconds_after,
                             through_proxy=through_proxy)
            runs.append(run)
            print(table([run]).splitlines()[-1]
                  + ("" if run.ok else "  PROBLEMS: " + "; ".join(run.problems)), flush=True)
    print()
    print(table(runs))
    failed = [run for run in runs if not run.ok]
    for run in failed:
        print(f"FAILED {run.faults[0].fault}: {'; '.join(run.problems)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
