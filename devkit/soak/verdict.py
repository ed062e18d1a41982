"""The soak's judgement, from the samples, the proxy's log and the records: pure functions, so
the rules are tested without running a soak (tests/devkit/test_soak_verdict.py)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from statistics import fmean

from devkit.soak.samples import Sample

MEMORY_TOLERANCE = 0.05  # resident memory after warm-up within 5% of its level just after warm-up
FDS_PER_CONNECTION = 2  # a client connection holds its own socket and its broker connection's


@dataclass(slots=True)
class Memory:
    baseline: float  # mean RSS over the window just after warm-up
    tail: float  # mean RSS over the last window
    peak: float  # max RSS after warm-up
    ok: bool

    def lines(self) -> list[str]:
        mib = 1024 * 1024
        return [f"RSS after warm-up: {self.baseline / mib:.1f} MiB (mean of the first window), "
                f"{self.tail / mib:.1f} MiB (mean of the last window, {self.tail / self.baseline - 1:+.1%}), "
                f"peak {self.peak / mib:.1f} MiB ({self.peak / self.baseline - 1:+.1%}): "
                + ("flat within 5%" if self.ok else "NOT flat within 5%")]


def memory(samples: list[Sample], warm_up: float, window: float) -> Memory:
    """RSS over [warm_up, warm_up + window) against the last `window` seconds and the peak after
    warm-up; ok when both are within MEMORY_TOLERANCE of the first (the tail below it too)."""
    end = samples[-1].seconds
    first = [s.rss_bytes for s in samples if warm_up <= s.seconds < warm_up + window]
    last = [s.rss_bytes for s in samples if s.seconds > end - window]
    after = [s.rss_bytes for s in samples if s.seconds >= warm_up]
    if not first or not last:
        raise ValueError(f"no samples in the windows: run longer than {warm_up + window:.0f} s")
    baseline, tail, peak = fmean(first), fmean(last), float(max(after))
    ok = abs(tail / baseline - 1) <= MEMORY_TOLERANCE and peak / baseline - 1 <= MEMORY_TOLERANCE
    return Memory(baseline, tail, peak, ok)


@dataclass(slots=True)
class Descriptors:
    warm: Sample  # the reading with the churn paused after warm-up
    end: Sample  # the one at the end

    @staticmethod
    def unexplained(s: Sample) -> int:
        """Descriptors not held by an open client connection: listeners, the event loop, files."""
        return s.fds - FDS_PER_CONNECTION * s.connections_open

    @property
    def ok(self) -> bool:
        return self.unexplained(self.end) <= self.unexplained(self.warm)

    def lines(self) -> list[str]:
        w, e = self.warm, self.end
        return [f"fds with the churn paused: {w.fds} at {w.seconds:.0f} s ({w.connections_open} client "
                f"connections) -> {e.fds} at {e.seconds:.0f} s ({e.connections_open}); not held by a "
                f"connection: {self.unexplained(w)} -> {self.unexplained(e)}: "
                + ("no growth" if self.ok else "GROWTH")]


def descriptors(samples: list[Sample]) -> Descriptors:
    quiet = [s for s in samples if s.quiet]
    if len(quiet) < 2:
        raise ValueError("fewer than two readings with the churn paused")
    return Descriptors(quiet[0], quiet[-1])


BAD = re.compile(r" (ERROR|CRITICAL) |^Traceback|^\s+File \"")
WARNING = re.compile(r" WARNING (\S+): (.*)$")


def log_problems(text: str) -> list[str]:
    """Lines that must never appear: ERROR, CRITICAL, and any traceback."""
    return [line for line in text.splitlines() if BAD.search(line)]


def warnings(text: str) -> Counter[str]:
    """WARNING lines by message, with addresses and numbers replaced, so alike ones count together."""
    found: Counter[str] = Counter()
    for line in text.splitlines():
        m = WARNING.search(line)
        if m:
            found[f"{m[1]}: {re.sub(r'[0-9]+', 'N', m[2])}"] += 1
    return found


@dataclass(frozen=True, slots=True)
class Jump:
    """A reader's offsets on `partition` went from `expected` (the one after the last it returned)
    straight to `got`: it passed over `expected`..`got`-1. The soak's topic has no transactions
    and no compaction, so its offsets have no gaps of their own."""

    partition: int
    expected: int
    got: int

    def covers(self, partition: int, offset: int) -> bool:
        return partition == self.partition and self.expected <= offset < self.got


@dataclass(slots=True)
class LiveReader:
    """What a reader that ran throughout the soak returned: every key, and the jumps in its offsets."""

    seen: set[int]
    jumps: list[Jump] = field(default_factory=list)


@dataclass(slots=True)
class PassedOver:
    """Records in the log that a live reader never returned. `jumped`: inside a jump in its
    offsets, which is how Tansu's answers make a reader pass over a batch it had not yet stored
    when it answered (docs/reliability.md, "Soak"; `python -m devkit.tansu_fetch_gap`).
    `unexplained`: the rest, a loss on the way to the reader."""

    jumped: int = 0
    unexplained: int = 0
    examples: list[str] = field(default_factory=list)


def passed_over(acked: set[int], in_log: set[int], where: dict[int, tuple[int, int]],
                reader: LiveReader) -> PassedOver:
    """The acknowledged records in the log that `reader` did not return, split by whether one of
    its jumps covers the record's place in the log (`where`: key -> partition, offset)."""
    out = PassedOver()
    for key in sorted((acked & in_log) - reader.seen):
        place = where.get(key)
        if place is not None and any(j.covers(*place) for j in reader.jumps):
            out.jumped += 1
        else:
            out.unexplained += 1
            if len(out.examples) < 5:
                at = f"partition {place[0]} offset {place[1]}" if place else "place unknown"
                out.examples.append(f"{key >> 56}/{key & ((1 << 56) - 1)} ({at})")
    return out


@dataclass(slots=True)
class Records:
    acked: int
    missing_log: int  # acknowledged, not in the log read back from the beginning at the end
    duplicated_idempotent: int  # in the log more than once, from an idempotent producer
    duplicated_other: int  # in the log more than once, from aiokafka (not idempotent)
    group_repeats: int  # read twice by the group (a rebalance re-reads from the committed offset)
    examples: list[str]  # a few records missing from the log, as producer/sequence
    group: PassedOver = field(default_factory=PassedOver)  # the consumer group's
    live: PassedOver = field(default_factory=PassedOver)  # the plain-fetch reader's
    jumps: list[str] = field(default_factory=list)  # the readers' jumps, described

    @property
    def ok(self) -> bool:
        """Nothing acknowledged missing from the log, nothing twice from an idempotent producer,
        and every record a live reader did not return passed over in a jump of its offsets."""
        return (self.missing_log == 0 and self.duplicated_idempotent == 0
                and self.group.unexplained == 0 and self.live.unexplained == 0)

    def lines(self) -> list[str]:
        out = [f"records: {self.acked} acknowledged; missing from the log {self.missing_log}; in the "
               f"log twice: {self.duplicated_idempotent} from idempotent producers, "
               f"{self.duplicated_other} from aiokafka; read twice by the group {self.group_repeats}"]
        out += [f"  missing from the log: {x}" for x in self.examples]
        for name, p in (("group", self.group), ("plain-fetch reader", self.live)):
            out.append(f"in the log, not returned by the {name}: {p.jumped} passed over in jumps of its "
                       f"offsets (Tansu's answers, see docs/reliability.md), {p.unexplained} unexplained")
            out += [f"  unexplained: {x}" for x in p.examples]
        out += [f"  jump: {j}" for j in self.jumps[:10]]
        return out


def records(acked: set[int], idempotent: set[int], in_log: set[int], log_repeats: list[int],
            where: dict[int, tuple[int, int]], group: LiveReader, group_repeats: list[int],
            live: LiveReader) -> Records:
    repeats = [k for k in set(log_repeats) if k in acked]
    dup_idem = sum(1 for k in repeats if k >> 56 in idempotent)
    missing = sorted(acked - in_log)
    examples = [f"{k >> 56}/{k & ((1 << 56) - 1)}" for k in missing[:5]]
    jumps = [f"{name}: partition {j.partition}, offsets {j.expected}..{j.got - 1}"
             for name, r in (("group", group), ("plain-fetch reader", live)) for j in r.jumps]
    return Records(len(acked), len(missing), dup_idem, len(repeats) - dup_idem, len(group_repeats),
                   examples, passed_over(acked, in_log, where, group),
                   passed_over(acked, in_log, where, live), jumps)
