"""One soak: Tansu, the proxy as a process, the workload, the samples, the verdict."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devkit.processes import ProxyProcess
from devkit.soak import samples as sampling
from devkit.soak import verdict
from devkit.soak.disturbers import AbruptCloser, Churn, ConfigRewriter, QuotaChanger
from devkit.soak.quota_admin import QuotaAdmin
from devkit.soak.samples import Sample
from devkit.soak.workload import (
    ConfluentProducer,
    KafkaPythonProducer,
    Ledger,
    Reader,
    Worker,
    pause,
    read_back,
    resume,
    stop_all,
)
from devkit.tansu import Broker

TOPIC, PARTITIONS = "soak", 3
THROTTLED_VALUES = [32 * 1024, 64 * 1024, 128 * 1024]  # producer_byte_rate set through the API
YAML_VARIANTS = [  # the quotas: list the config rewrites go round
    [{"client-id": "soak-kafka-python", "producer_byte_rate": 24 * 1024},
     {"client-id": "soak-churn-fetch", "consumer_byte_rate": 64 * 1024}],
    [{"client-id": "soak-kafka-python", "producer_byte_rate": 1024 * 1024},
     {"client-id": "soak-churn-fetch", "consumer_byte_rate": 256 * 1024}],
]
CATCH_UP_SECONDS = 120.0  # how long the readers may take to read the last records
READER_CLIENT_IDS = ("soak-group-reader", "soak-fetch-reader")


@dataclass
class Plan:
    seconds: float
    warm_up: float  # the first seconds, not judged for memory
    window: float  # the memory comparison windows (just after warm-up; the end)
    sample_every: float = 5.0
    quota_every: float = 3.0
    reload_every: float = 30.0

    @classmethod
    def for_minutes(cls, minutes: float) -> Plan:
        """Five minutes' warm-up and five-minute windows for a full run; shorter ones scale down
        (the memory bound is not judged under 15 minutes, see Outcome.ok)."""
        seconds = minutes * 60
        warm_up = min(300.0, max(30.0, seconds / 3))
        return cls(seconds, warm_up, min(300.0, (seconds - warm_up) / 2),
                   reload_every=min(30.0, max(10.0, seconds / 6)))


@dataclass
class Outcome:
    plan: Plan
    samples: list[Sample]
    memory: verdict.Memory
    fds: verdict.Descriptors
    records: verdict.Records
    log_problems: list[str]
    warnings: dict[str, int]
    failures: list[str]  # client-side: a worker's step that failed, a delivery error
    counts: dict[str, int] = field(default_factory=dict)
    exit_code: int | None = None

    @property
    def judge_memory(self) -> bool:
        return self.plan.seconds >= 15 * 60

    @property
    def ok(self) -> bool:
        return (self.fds.ok and self.records.ok and not self.log_problems and not self.failures
                and self.exit_code == 0 and (self.memory.ok or not self.judge_memory))

    def report(self) -> list[str]:
        lines = [f"soak: {self.plan.seconds / 60:.1f} min, warm-up {self.plan.warm_up:.0f} s, "
                 f"memory windows {self.plan.window:.0f} s, {len(self.samples)} samples"]
        lines += [", ".join(f"{k} {v}" for k, v in self.counts.items())]
        lines += self.memory.lines() + ([] if self.judge_memory else ["  (memory not judged: under 15 min)"])
        lines += self.fds.lines() + self.records.lines()
        lines += [f"proxy log: {len(self.log_problems)} ERROR/Traceback lines"]
        lines += [f"  {x}" for x in self.log_problems[:20]]
        lines += [f"proxy log WARNING x{n}: {w}" for w, n in self.warnings.items()]
        lines += [f"client failure: {f}" for f in self.failures[:30]]
        lines += [f"proxy exit status on SIGTERM: {self.exit_code}", "PASS" if self.ok else "FAIL"]
        return lines


def _create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])[TOPIC].result(30)


QUIET_READINGS = 3  # readings taken 0.5 s apart with the churn paused; the fewest unexplained fds count


def _quiet_reading(proxy: ProxyProcess, churn: list[Worker], take: Callable[[bool], Sample]) -> Sample:
    """Pause the churn, wait until the proxy's connection count and its descriptors hold still for
    2 s, then read three times, 0.5 s apart, and keep the reading with the fewest descriptors no
    client connection holds (`verdict.Descriptors.unexplained`). The long-lived clients go on
    meanwhile: a connection one of them is closing or opening (kafka-python's after a 60 s
    request timeout, the quota changer's admin client) can hold a descriptor without being
    counted, for a moment; one reading with it showed a growth of one (18 -> 19) that the next
    would not have. A leaked descriptor stays in all three."""
    pause(churn, 120.0)
    last: tuple[int, int] = (-1, -1)
    steady_since, deadline = time.monotonic(), time.monotonic() + 30
    while time.monotonic() < deadline:
        reading = take(False)
        now = (reading.connections_open, reading.fds)
        if now != last:
            last, steady_since = now, time.monotonic()
        elif time.monotonic() - steady_since >= 2.0:
            break
        time.sleep(0.25)
    readings = [take(True)]
    for _ in range(QUIET_READINGS - 1):
        time.sleep(0.5)
        readings.append(take(True))
    resume(churn)
    return min(readings, key=verdict.Descriptors.unexplained)


def run(minutes: float, out: Path, say: Callable[[str], None] = print) -> Outcome:
    plan = Plan.for_minutes(minutes)
    out.mkdir(parents=True, exist_ok=True)
    # The Python clients' own notes (throttles, request timeouts, retries, reconnects) go to
    # clients.log, with times, rather than to the terminal.
    client_log = logging.FileHandler(out / "clients.log", mode="w")
    client_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(message)s"))
    client_loggers = [logging.getLogger(name) for name in ("kafka", "aiokafka")]
    before = [(logger.level, logger.propagate) for logger in client_loggers]
    for logger in client_loggers:
        logger.setLevel(logging.WARNING)
        logger.addHandler(client_log)
        logger.propagate = False
    broker = Broker(log_dir=out).start()
    proxy = ProxyProcess(broker.address, broker.node_id(), extra_config={"quotas": YAML_VARIANTS[0]})
    workers: list[Worker] = []
    try:
        proxy.start()
        assert proxy.config_path is not None and proxy.log_path is not None
        _create_topic(proxy.bootstrap)
        host, port = proxy.bootstrap.rsplit(":", 1)
        ledger = Ledger()
        steady = ConfluentProducer(proxy.bootstrap, TOPIC, "soak-steady", 1, 200, ledger)
        throttled = ConfluentProducer(proxy.bootstrap, TOPIC, "soak-throttled", 2, None, ledger,
                                      **{"queue.buffering.max.kbytes": 128})
        kafka_python = KafkaPythonProducer(proxy.bootstrap, TOPIC, "soak-kafka-python", 3, 100, ledger)
        group = Reader(proxy.bootstrap, TOPIC, PARTITIONS, READER_CLIENT_IDS[0], "soak-group")
        fetch = Reader(proxy.bootstrap, TOPIC, PARTITIONS, READER_CLIENT_IDS[1], None)
        quotas = QuotaChanger(host, int(port), "soak-throttled", THROTTLED_VALUES, plan.quota_every)
        rewriter = ConfigRewriter(proxy.config_path, YAML_VARIANTS, plan.reload_every)
        churn: list[Worker] = [Churn(proxy.bootstrap, TOPIC, ledger, 10), AbruptCloser(host, int(port))]
        producers: list[Worker] = [steady, throttled, kafka_python]
        workers = [quotas, *producers, group, fetch, rewriter, *churn]
        start = time.monotonic()
        for w in workers:
            w.start()

        def take(quiet: bool) -> Sample:
            return sampling.take(proxy, time.monotonic() - start, ledger.count(), len(group.seen),
                                 len(fetch.seen), quiet)

        taken: list[Sample] = []
        scrape_failures: list[str] = []
        quiet_done = False
        next_sample = 0.0
        while (elapsed := time.monotonic() - start) < plan.seconds:
            if not quiet_done and elapsed >= plan.warm_up:
                taken.append(_quiet_reading(proxy, churn, take))
                quiet_done = True
            elif elapsed >= next_sample:
                try:
                    s = take(False)
                except OSError as exc:  # /metrics did not answer (HTTPError is an OSError): a failure
                    scrape_failures.append(f"scrape at {elapsed:.0f} s: {exc!r}")
                    next_sample += plan.sample_every
                    continue
                taken.append(s)
                while next_sample <= elapsed:  # after a quiet reading, no catching up
                    next_sample += plan.sample_every
                if len(taken) % 12 == 0:
                    say(f"{s.seconds:6.0f} s  rss {s.rss_bytes / sampling.MiB:6.1f} MiB  fds {s.fds:4d}  "
                        f"conns {s.connections_open:3d}  acked {s.produced:8d}  read {s.consumed_fetch:8d}  "
                        f"group {s.consumed_group:8d}  throttled {s.throttled_requests}")
            time.sleep(0.2)
        taken.append(_quiet_reading(proxy, churn, take))
        say(f"{time.monotonic() - start:6.0f} s  stopping the workload")
        stuck = stop_all([*churn, quotas, rewriter], 60.0)
        # The operator lifts the throttled producers' quotas, so that what they have in flight
        # drains in seconds rather than at 24 or 32 KiB/s.
        rewriter.write(YAML_VARIANTS[1])
        lift = QuotaAdmin(host, int(port))
        with contextlib.suppress(OSError):
            lift.alter([("client-id", "soak-throttled")], "producer_byte_rate", 1024 * 1024)
        lift.close()
        time.sleep(2.0)  # the proxy polls its config once a second
        stuck += stop_all(producers, 120.0)
        say(f"{time.monotonic() - start:6.0f} s  producers stopped; reading the log back")
        # Read back while the live readers go on: its end of each partition is where they must
        # get to. (A reader that passed over a record never has them all, so waiting for every
        # acknowledged record would wait out the catch-up for it.) Where the records they have not
        # returned yet are in the log is noted: those they never return are among them.
        log = read_back(proxy.bootstrap, TOPIC, PARTITIONS,
                        watch=(ledger.acked - fetch.seen) | (ledger.acked - group.seen))
        say(f"{time.monotonic() - start:6.0f} s  read back: {len(log.seen)} records, partitions at "
            f"{log.positions}; waiting for the readers to get there")
        deadline = time.monotonic() + CATCH_UP_SECONDS
        ends = list(enumerate(log.positions))
        while time.monotonic() < deadline and not all(
                r.next_offsets.get(partition, 0) >= end for r in (fetch, group) for partition, end in ends):
            time.sleep(0.5)
        stuck += stop_all([group, fetch], 30.0)
        say(f"{time.monotonic() - start:6.0f} s  readers stopped")
        # The live readers are under no quota: none of their fetches got the proxy's throttled,
        # empty answer (which carries no partition, so no offset a reader could move to).
        reader_throttles = sum(proxy.metric("kafka_quota_proxy_throttled_requests_total", quota_type=q,
                                            user="ANONYMOUS", client_id=c)
                               for q in ("fetch", "request") for c in READER_CLIENT_IDS)
        exit_code = proxy.terminate()
        say(f"{time.monotonic() - start:6.0f} s  proxy stopped (SIGTERM)")
        log_text = proxy.log_text()
        (out / "proxy.log").write_text(log_text)
        failures = [f"{w.name}: {f}" for w in workers for f in w.failures] + [str(f) for f in ledger.errors]
        failures += [f"{r.name}: {e}" for r in (group, fetch) for e in r.errors]
        failures += [f"read back: {e}" for e in log.errors] + scrape_failures
        say(f"positions by partition: plain fetch {fetch.positions}, group {group.positions}")
        failures += [f"{name}: did not stop" for name in stuck]
        failures += [f"{p.name}: {p.unflushed} not flushed"
                     for p in (steady, throttled) if p.unflushed]
        outcome = Outcome(
            plan, taken, verdict.memory(taken, plan.warm_up, plan.window), verdict.descriptors(taken),
            verdict.records(ledger.acked, ledger.idempotent, log.seen, log.repeats, log.where,
                            verdict.LiveReader(group.seen, group.jumps), group.repeats,
                            verdict.LiveReader(fetch.seen, fetch.jumps)),
            verdict.log_problems(log_text), dict(verdict.warnings(log_text)), failures,
            counts={"AlterClientQuotas": quotas.changes, "config rewrites": rewriter.rewrites,
                    "config reloads": log_text.count("config reloaded from"),
                    "churn rounds": churn[0].rounds, "abrupt closes": churn[1].rounds,
                    "connections accepted": taken[-1].connections_accepted,
                    "requests": taken[-1].requests, "throttled requests": taken[-1].throttled_requests,
                    "protocol errors": taken[-1].protocol_errors,
                    "live readers' throttled fetches": round(reader_throttles),
                    "group assignments": group.assignments,
                    "kafka-python's longest wait for an ack (s)": round(kafka_python.longest_wait)},
            exit_code=exit_code)
        sampling.write_csv(taken, out / "samples.csv")
        sampling.plot(taken, plan.warm_up, out / "soak.png",
                      f"kafka-quota-proxy soak, {plan.seconds / 60:.0f} min")
        (out / "report.txt").write_text("\n".join(outcome.report()) + "\n")
        return outcome
    finally:
        stop_all(workers, 5.0)
        proxy.stop()
        broker.stop()
        for logger, (level, propagate) in zip(client_loggers, before, strict=True):
            logger.removeHandler(client_log)
            logger.setLevel(level)
            logger.propagate = propagate
        client_log.close()
