"""bench.kafka_fidelity's table: each outcome's rows, and each case's medians per path with the
proxy's gap from Kafka's broker against the fidelity bounds (rate 3%, fullest window 0.05x, the
throttle per response 15%); and a run's timeline written out for --timelines."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from bench.fidelity_reading import ONE_BUDGET, PATHS, SHARE_EMPTY, Outcome
from bench.many_connections import RATE_BOUND, WINDOW_BOUND
from bench.shared_accuracy import SLIDING_S

THROTTLE_BOUND = 0.15  # the proxy's median throttle per response within 15% of Kafka's


def rows_of(r: Outcome) -> list[tuple[str, str]]:
    name = f"{r.case}, {r.path}, run {r.round + 1}"
    rows = []
    if r.rate is not None and r.worst is not None and r.span is not None:
        if r.unit:
            rows.append((f"{name}: {r.unit}, {r.span[0]:.1f}-{r.span[1]:.1f} s",
                         f"{r.rate:.1f}, fullest window {r.worst / SLIDING_S:.1f} from {r.worst_at:.2f} s"))
        else:
            rows.append((f"{name}: rate / quota, {r.span[0]:.1f}-{r.span[1]:.1f} s",
                         f"{r.rate / r.quota:.3f}, worst {r.worst / (r.quota * SLIDING_S):.3f}x "
                         f"from {r.worst_at:.2f} s"))
    mean, each = r.mean_throttle, r.throttle_per_response
    told = f"{len(r.throttles)} throttled" + (f", mean {mean:.0f} ms" if mean is not None else "")
    if each is not None:
        told += f", {each:.1f} ms a response of {r.responses}"
    if r.metrics:
        told += ", the tool's " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.metrics.items()))
    rows.append((f"{name}: throttles told", told))
    if r.errors:
        rows.append((f"{name}: errors", "; ".join(r.errors)))
    return rows


def medians(results: Sequence[Outcome]) -> list[tuple[str, str]]:
    """Each case's medians per path over its measured runs (rate, worst window, throttle), then
    the proxy's gap from Kafka's broker where both have runs, against the bounds. The throttle is
    the one told per response where every run of the case counted its responses, else the mean
    of the throttled responses (said which)."""
    by_case: dict[str, dict[str, list[Outcome]]] = {}
    for r in results:
        if r.rate is not None and r.worst is not None:
            by_case.setdefault(r.case, {}).setdefault(r.path, []).append(r)
    rows: list[tuple[str, str]] = []
    for case, by_path in by_case.items():
        mid: dict[str, tuple[float, float, float | None]] = {}
        unit = next(iter(by_path.values()))[0].unit  # every run of a case has the same
        counted = all(r.responses for runs in by_path.values() for r in runs)
        label = "throttle a response" if counted else "mean throttle"
        for path in (*PATHS, ONE_BUDGET, SHARE_EMPTY):
            runs = by_path.get(path)
            if not runs:
                continue
            quota = runs[0].quota  # every run of a case has the same
            rate = statistics.median(r.rate for r in runs if r.rate is not None) / quota
            worst = statistics.median(r.worst for r in runs if r.worst is not None) / (quota * SLIDING_S)
            means = [m for r in runs if (m := r.throttle_per_response if counted
                                         else r.mean_throttle) is not None]
            throttle = statistics.median(means) if means else None
            mid[path] = (rate, worst, throttle)
            figures = (f"{rate:.1f} {unit}, fullest window {worst:.1f}" if unit
                       else f"{rate:.3f}, worst {worst:.3f}x")
            told = "-" if throttle is None else f"{throttle:.1f} ms" if counted else f"{throttle:.0f} ms"
            rows.append((f"{case}, {path}: median of {len(runs)}",
                         f"{figures}, {label} {told} (rates "
                         f"{', '.join(f'{r.rate / quota:.3f}' for r in runs if r.rate is not None)})"))
        if "kafka" in mid and "proxy" in mid:
            rows.append((f"{case}: proxy - Kafka", gap(mid["kafka"], mid["proxy"],
                                                       relative_window=bool(unit), label=label)))
    return rows


def gap(kafka: tuple[float, float, float | None], proxy: tuple[float, float, float | None],
        relative_window: bool = False, label: str = "mean throttle") -> str:
    """The proxy's medians against Kafka's: rate (relative), worst window (in the quota's worth, or
    with `relative_window` relative, where there is no quota to measure it in), the throttle
    (`label`: which one; relative), and whether all three are within the bounds."""
    rate_gap = proxy[0] / kafka[0] - 1
    if relative_window:
        window_gap = proxy[1] / kafka[1] - 1
        within = abs(rate_gap) <= RATE_BOUND and abs(window_gap) <= RATE_BOUND
        text = f"rate {rate_gap:+.1%}, fullest window {window_gap:+.1%}"
    else:
        window_gap = proxy[1] - kafka[1]
        within = abs(rate_gap) <= RATE_BOUND and abs(window_gap) <= WINDOW_BOUND
        text = f"rate {rate_gap:+.1%}, worst {window_gap:+.3f}x"
    if kafka[2] and proxy[2] is not None:
        throttle_gap = proxy[2] / kafka[2] - 1
        within = within and abs(throttle_gap) <= THROTTLE_BOUND
        text += f", {label} {throttle_gap:+.1%}"
    else:
        within = False
        text += f", {label} not compared (no throttles on a path)"
    bounds = f"{RATE_BOUND:.0%}, {WINDOW_BOUND}x, {THROTTLE_BOUND:.0%}"
    return f"{text}: {'within' if within else 'outside'} {bounds}"


def write_timeline(directory: Path, out: Outcome) -> None:
    """`out`'s timeline as CSV (seconds, bytes or partitions so far), one file per case, path and
    round: where an outlier's fullest window came from."""
    if out.timeline is not None:
        # to the microsecond: whether a fullest window holds a burst can turn on less than a ms
        lines = [f"{t:.6f},{n}" for t, n in out.timeline.marks]
        Path(directory, f"{out.case}-{out.path}-{out.round + 1}.csv").write_text(
            "seconds,so_far\n" + "\n".join(lines) + "\n")
