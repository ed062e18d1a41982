"""The soak's judgement, from the samples, the proxy's log and the records: pure functions, so
the rules are tested without running a soak (tests/devkit/test_soak_verdict.py)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
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


@dataclass(slots=True)
class Records:
    acked: int
    missing_fetch: int  # acknowledged, not in the log read back from the beginning at the end
    missing_group: int  # acknowledged, never read by the consumer group
    duplicated_idempotent: int  # in the log more than once, from an idempotent producer
    duplicated_other: int  # in the log more than once, from aiokafka (not idempotent)
    group_repeats: int  # read twice by the group (a rebalance re-reads from the committed offset)
    examples: list[str]  # a few missing records, as producer/sequence
    live_skipped: int = 0  # in the log, but passed over by the plain-fetch reader that ran throughout


    @property
    def ok(self) -> bool:
        return self.missing_fetch == 0 and self.missing_group == 0 and self.duplicated_idempotent == 0

    def lines(self) -> list[str]:
        return [f"records: {self.acked} acknowledged; missing from the log {self.missing_fetch}, "
                f"from the group {self.missing_group}; in the log twice: {self.duplicated_idempotent} "
                f"from idempotent producers, {self.duplicated_other} from aiokafka; read twice by the "
                f"group {self.group_repeats}; passed over by the live plain-fetch reader "
                f"{self.live_skipped}"] + [f"  missing: {x}" for x in self.examples]


def records(acked: set[int], idempotent: set[int], in_log: set[int], log_repeats: list[int],
            group_seen: set[int], group_repeats: list[int], live_seen: set[int] | None = None) -> Records:
    repeats = [k for k in set(log_repeats) if k in acked]
    dup_idem = sum(1 for k in repeats if k >> 56 in idempotent)
    live = in_log if live_seen is None else live_seen
    missing = sorted((acked - in_log) | (acked - group_seen) | (acked - live))[:5]
    examples = [f"{k >> 56}/{k & ((1 << 56) - 1)} (log: {k in in_log}, group: {k in group_seen}, "
                f"live reader: {k in live})" for k in missing]
    return Records(len(acked), len(acked - in_log), len(acked - group_seen), dup_idem,
                   len(repeats) - dup_idem, len(group_repeats), examples, len((acked & in_log) - live))
