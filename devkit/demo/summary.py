"""The demo's closing report: what each producer averaged over the quota's own window at the end
of the run, the throttling the proxy applied and librdkafka saw, whether every acknowledged
record came back to the consumer, and whether everything the demo started has stopped."""

from __future__ import annotations

from typing import Protocol

from devkit.demo.clients import ReadBack, SampleConsumer, SampleProducer
from devkit.demo.counts import ProxyCounts
from devkit.demo.diagnosis import Lookup, verdict
from devkit.demo.inprocess import ProxyThread
from devkit.demo.view import api_summary, mib_rate, quota_text
from devkit.kafka import KafkaBroker
from devkit.tansu import Broker


class Demo(Protocol):
    """What the summary reads of a finished demo run (run.Demo is the one implementation)."""

    broker: Broker | KafkaBroker | None
    broker_name: str
    proxy: ProxyThread | None
    producers: list[SampleProducer]
    consumer: SampleConsumer | None
    ran_for: float
    history: list[tuple[float, list[int]]]
    window_num: int
    window_size_seconds: float
    final_proxy: ProxyCounts
    failed_reason: str
    lookups: list[Lookup]

    @property
    def quota_window(self) -> float: ...

    @property
    def acked(self) -> set[int]: ...

    @property
    def read_back(self) -> ReadBack | None: ...

    def settled_rates(self, seconds: float) -> tuple[float, list[float]]: ...

# How close to its quota the limited producer's rate over one whole quota window must be. Kafka
# (and the proxy) hold a client to its quota over that window, not over every second of it.
WITHIN = 0.15
BURSTS = ("  a flat-out client moves in window-sized bursts, on Kafka too: it runs ahead, is throttled "
          "until its rate over the window is back at its quota, and bursts again")


def _quota_lines(demo: Demo) -> list[str]:
    """How each producer ended up: its rate over the quota's window at the end of the run against
    its quota, and the throttling the proxy applied and librdkafka reported."""
    window = demo.quota_window
    span, rates = demo.settled_rates(window)
    whole = span >= window - 0.5  # the run covered at least one whole window
    lines = [f"  over the last {span:.1f} s of the run, "
             + (f"one quota window ({demo.window_num} samples of {demo.window_size_seconds:g} s)"
                if whole else f"less than one quota window ({window:.0f} s)")
             + ", in acknowledged key+value bytes:"]
    for p, rate in zip(demo.producers, rates, strict=True):
        line = f"    {p.client_id:<13} {mib_rate(rate):>6} MiB/s, quota {quota_text(p.quota)}"
        if p.quota is not None:
            off = rate / p.quota - 1
            line += f": {off:+.0%} of its quota"
            if not whole:
                line += ", the first burst (a client may run ahead within its first window)"
            elif off > WITHIN:
                line += f", OUTSIDE the {WITHIN:.0%} allowed: the quota did not hold over its window"
            elif off < -WITHIN:
                # No quota is broken by sending less. A flat-out client moves in window-sized
                # bursts: when the run ends before its next burst is done (a loaded machine slows
                # the first one), its last window holds less than a window's worth.
                line += (f", under its quota by more than {WITHIN:.0%}: its next window-sized burst "
                         "had not come by the end of the run")
            else:
                line += f", within the {WITHIN:.0%} allowed"
        lines.append(line)
    if any(p.rate is None and p.quota is not None for p in demo.producers):
        lines.append(BURSTS)
    lines.append("  throttling, as the proxy applied it and librdkafka reported it:")
    for p in demo.producers:
        c = demo.final_proxy.quota(p.client_id)
        told = (f"librdkafka saw up to {p.throttle_max_seen:,.0f} ms" if p.throttle_max_seen
                else "librdkafka saw none")
        if c.throttled:
            lines.append(f"    {p.client_id:<13} throttled {c.throttled:,.0f} responses "
                         f"({c.throttle_ms:,.0f} ms in all, {c.throttle_ms / c.throttled:,.0f} ms "
                         f"avg); {told}")
        else:
            lines.append(f"    {p.client_id:<13} not throttled; {told}")
    return lines


def summary(demo: Demo, problems: list[str]) -> tuple[list[str], bool]:
    """The final report, and whether every acknowledged record came back."""
    lines = ["", "Summary"]
    cons = demo.consumer
    if not demo.producers or cons is None:
        lines.append("  the demo did not get as far as producing anything")
        ok = False
    else:
        acked = demo.acked
        in_doubt = set().union(*(p.purged_in_flight for p in demo.producers))
        produced, consumed = len(acked), len(cons.seen)
        in_log = cons.seen | (demo.read_back or set())
        missing = len(acked - in_log)
        passed_over = len(acked & in_log) - len(acked & cons.seen)
        unexpected = len(cons.seen - acked - in_doubt)
        ok = produced > 0 and missing == 0 and unexpected == 0
        secs = max(demo.ran_for, 1e-9)
        lines.append(f"  ran {demo.ran_for:.1f} s; on average "
                     + ", ".join(f"{p.client_id} {mib_rate(p.bytes / secs)} MiB/s"
                                 for p in demo.producers))
        if demo.history:
            lines.extend(_quota_lines(demo))
        lines.append(f"  produced {produced:,} records (acknowledged), consumed {consumed:,}: "
                     + ("MATCH" if ok else "MISMATCH"))
        if demo.read_back is not None:
            lines.append(f"  the log read back through the proxy: {len(demo.read_back):,} records in "
                         f"{demo.read_back.seconds:.1f} s"
                         + ("" if demo.read_back.complete else ", stopped at its deadline before the end "
                            "of every partition"))
        if missing:
            lines.append(f"  {missing:,} acknowledged record(s) never reached the consumer"
                         + (", nor the log read back" if demo.read_back is not None else ""))
            if demo.lookups:
                lines.append("  each missing record at the partition and offset the broker "
                             "acknowledged for it, read straight from the broker:")
                lines.extend(f"    {x.line()}" for x in demo.lookups)
                lines.append(f"  {verdict(demo.lookups)}")
        if passed_over:
            lines.append(f"  {passed_over:,} acknowledged record(s) the live consumer passed over "
                         "were in the log read back at the end (Tansu answered a Fetch without a "
                         "batch not yet stored; docs/reliability.md)")
        if unexpected:
            lines.append(f"  {unexpected:,} record(s) consumed that no producer saw acknowledged")
        if cons.duplicates:
            lines.append(f"  {cons.duplicates:,} duplicate(s) consumed (producer retries)")
        for p in demo.producers:
            if p.purged:
                lines.append(f"  {p.purged:,} record(s) still queued in {p.client_id} at the end "
                             "were purged unsent (not counted)")
            if p.purged_in_flight:
                lines.append(f"  {len(p.purged_in_flight):,} record(s) of {p.client_id} were "
                             "given up on in flight (not counted, consumed or not)")
            if p.errors:
                lines.append(f"  {p.client_id}: {p.errors:,} delivery error(s), last: {p.last_error}")
            if p.unflushed:
                lines.append(f"  {p.client_id}: {p.unflushed:,} record(s) still unsent when it "
                             "gave up")
        if cons.errors:
            lines.append(f"  {cons.errors:,} consumer error(s), last: {cons.last_error}")
    if demo.final_proxy.apis:
        lines.append("  proxy saw:")
        lines.extend(api_summary(demo.final_proxy))
    if demo.failed_reason:
        lines.append(f"  stopped early: {demo.failed_reason}")
    stopped = []
    if demo.broker is not None and demo.broker.proc is not None:
        stopped.append(f"{demo.broker_name} broker (pid {demo.broker.proc.pid}) "
                       + ("stopped" if demo.broker.stopped else "STILL RUNNING"))
    if demo.proxy is not None:
        stopped.append("proxy " + ("stopped" if demo.proxy.stopped else "NOT STOPPED"))
    if stopped:
        lines.append("  " + "; ".join(stopped) + "; clients closed")
    lines.extend(f"  problem: {p}" for p in problems)
    return lines, ok and not problems
