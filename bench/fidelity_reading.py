"""What bench.kafka_fidelity reads: each path's outcome of a case, what the clients' output says
(throttled responses, the Java tools' metrics, a consumer's fetch positions, the loops' lines), and
the rate and fullest window judged from a timeline (the broker's end offsets, or the client's)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime

from bench.end_offsets import EndOffsets
from bench.many_connections import QUOTA
from bench.shared_accuracy import SLIDING_S, fullest, fullest_between_readings
from devkit.producing import Timeline

PATHS = ("kafka", "proxy")
# The three-broker case's third path: a proxy with quota.scope cluster, one budget for all three
# brokers, which Kafka has no counterpart for; judged against the quota alone.
ONE_BUDGET = "proxy-cluster"
# The share consumer case's third path: a proxy with quota.share_fetch_throttle empty, which
# answers a throttled ShareFetch empty as Kafka's broker does, where by default it delivers.
SHARE_EMPTY = "proxy-empty"

# What the clients write: the NetworkClient line of a throttled response (TRACE), a Java consumer's
# FETCH requests (DEBUG), a --print-metrics line, and the Java loops' lines (bench/java/).
THROTTLED = re.compile(r"Connection to node -?\d+ is throttled for (\d+) ms")
RECEIVED = r"\] DEBUG .* Received {api} response from node"
SENT_FETCH = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] .*Sending FETCH request")
FETCH_OFFSET = re.compile(r"fetchOffset=(\d+)")
METRIC = re.compile(r"^([\w-]+):([\w.-]+):\{([^}]*)\}\s*:\s*(\S+)\s*$")
GIVEN = re.compile(r"^(\d+) (\d+)$", re.M)
CREATED = re.compile(r"^(\d+) created \S+$", re.M)
REFUSED = re.compile(r"^(\d+) refused (\d+)$", re.M)
FAILED = re.compile(r"^\d+ error (.*)$", re.M)


@dataclass
class Outcome:
    """One path's run of one case."""

    case: str
    path: str
    round: int = 0
    rate: float | None = None  # bytes/s over whole windows, measured at the broker
    worst: float | None = None  # bytes in the fullest sliding 11 s window of that span
    worst_at: float = 0.0  # where that window starts, seconds after the start
    span: tuple[float, float] | None = None  # seconds after the start
    throttles: list[int] = field(default_factory=list)  # ms, each response that throttled
    # the responses of the quota's API the client had, throttled or not (None: not counted)
    responses: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the Java tool's --print-metrics
    errors: list[str] = field(default_factory=list)
    quota: float = QUOTA  # bytes/s, the quota the rate is judged against
    timeline: Timeline | None = None  # what was judged, for --timelines
    # set where there is no quota to divide by: the rate and the fullest window's rate are
    # printed as they are, in this unit, and the proxy's window is compared relatively
    unit: str = ""

    @property
    def mean_throttle(self) -> float | None:
        """The mean of the throttled responses' throttles."""
        return statistics.fmean(self.throttles) if self.throttles else None

    @property
    def throttle_per_response(self) -> float | None:
        """The throttle told per response of the quota's API, the unthrottled ones counted as 0 ms:
        what the Java clients' own `produce-throttle-time-avg` and `fetch-throttle-time-avg`
        average, and the issue's "average client-reported throttle". Unlike `mean_throttle` it
        does not turn on how the same wait is split: perf-test at 1 KiB on Kafka's own broker was
        told 923 throttles of 60 ms in one run and 1674 of 33 ms in the next, 15.1 and 15.0 ms a
        response (docs/differences-from-kafka.md)."""
        return sum(self.throttles) / self.responses if self.responses else None


def responses(text: str, api: str) -> int:
    """How many responses of `api` (its name as Kafka's ApiKeys spells it: PRODUCE, FETCH, ...) a
    Java client logged receiving (its NetworkClient at DEBUG or finer, TRACE_NETWORK_LOG4J2)."""
    return len(re.findall(RECEIVED.format(api=re.escape(api)), text))


def throttles(text: str) -> list[int]:
    """The throttle time (ms) of each response a Java client logged as throttling it (at TRACE,
    TRACE_NETWORK_LOG4J2)."""
    return [int(m.group(1)) for m in THROTTLED.finditer(text)]


def fetch_positions(text: str, origin: float, record: int, wall_offset: float) -> Timeline:
    """A Java consumer's position over time from the FETCH requests its NetworkClient logged (at
    DEBUG): each asks from the offset after what it has been given, so the furthest offset asked so
    far times `record` (a partition of records of one size) is what it was given, stamped a few ms
    after it came. The log's times are this machine's wall clock in its time zone; `wall_offset`
    is time.time() - time.monotonic(), `origin` the monotonic start. One partition: offsets of
    several are not added up. (Its `--show-detailed-stats` are no clock: a line is printed only
    when a record is consumed after the interval, so a burst shows up to a throttle late.)"""
    out = Timeline([(0.0, 0)])
    furthest = first = None
    for line in text.splitlines():
        m = SENT_FETCH.match(line)
        if m is None:
            continue
        offsets = [int(x) for x in FETCH_OFFSET.findall(line)]
        if not offsets:
            continue
        if first is None:
            first = min(offsets)  # where it started reading: nothing given yet
        if furthest is not None and max(offsets) <= furthest:
            continue
        furthest = max(offsets)
        wall = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.marks.append((wall - wall_offset - origin, (furthest - first) * record))
    return out


def client_metrics(text: str) -> dict[str, float]:
    """`--print-metrics` lines ("group:name:{tags} : value") as {"group:name": value}; where a
    metric is printed for several tag sets (one per node, say), the largest. NaN (a sensor with no
    value yet) is left out."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if value != value:
            continue
        key = f"{m.group(1)}:{m.group(2)}"
        found[key] = max(found.get(key, value), value)
    return found


def judge(timeline: Timeline, out: Outcome, warm_up: float, between_readings: bool = False) -> Outcome:
    """The rate over whole SLIDING_S windows from `warm_up` after the first byte to the last whole
    one before the last byte, and the fullest sliding window of that span: `fullest`'s, stepped
    every 0.25 s, or with `between_readings` (the broker's end offsets, read every READ_EVERY_S)
    the most counted between two readings a window apart (`fullest_between_readings`)."""
    out.timeline = timeline
    marks = timeline.marks
    moving = [t for t, n in marks if n > 0]
    if not moving:
        out.errors.append("the broker appended nothing")
        return out
    final = marks[-1][1]
    last = next(t for t, n in marks if n >= final)
    start = moving[0] + warm_up
    windows = int((last - start) // SLIDING_S)
    if windows < 1:
        out.errors.append(f"{last - moving[0]:.1f} s from the first byte to the last: no whole "
                          f"{SLIDING_S:.0f} s window after the {warm_up:.0f} s warm-up")
        return out
    end = start + windows * SLIDING_S
    out.span = (start, end)
    out.rate = (timeline.at(end) - timeline.at(start)) / (end - start)
    out.worst, out.worst_at = (fullest_between_readings(marks, start, end) if between_readings
                               else fullest(timeline.at, start, end))
    return out


def judge_end_offsets(meter: EndOffsets, out: Outcome, warm_up: float) -> Outcome:
    """`judge` on what `meter` read, saying so where its readings failed or stalled."""
    if meter.timeline.errors:
        out.errors.append(f"{meter.timeline.errors} end-offset readings failed")
    out = judge(meter.timeline, out, warm_up, between_readings=True)
    stall, at = longest_gap(meter.timeline)
    if stall > 1.0:  # read every READ_EVERY_S: a window near it may hold up to that much less
        out.errors.append(f"the end offsets went unread for {stall:.1f} s from {at:.1f} s")
    return out


def share_progress(text: str) -> Timeline:
    """The value bytes ShareConsumeLoop was given over time: (seconds since its start, so far)."""
    return Timeline([(0.0, 0), *((int(m.group(1)) / 1000, int(m.group(2))) for m in GIVEN.finditer(text))])


def creations(text: str, partitions: int) -> Timeline:
    """The partitions CreateTopicsLoop created over time: (seconds since its start, so far)."""
    timeline = Timeline([(0.0, 0)])
    for i, m in enumerate(CREATED.finditer(text), 1):
        timeline.marks.append((int(m.group(1)) / 1000, i * partitions))
    return timeline


def longest_gap(timeline: Timeline) -> tuple[float, float]:
    """The longest time between two readings of `timeline`, and when it began."""
    marks = timeline.marks
    return max(((b[0] - a[0], a[0]) for a, b in zip(marks, marks[1:], strict=False)), default=(0.0, 0.0))
