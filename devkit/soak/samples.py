"""What the soak reads every few seconds: the proxy's resident memory and open descriptors (from
its pid, psutil), its /metrics (connections, requests, protocol errors, throttles), and the
workload's own counts; then the CSV of the samples and the plot."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import psutil

from devkit.processes import ProxyProcess

MiB = 1024 * 1024
PREFIX = "kafka_quota_proxy_"


@dataclass(slots=True)
class Sample:
    """One reading. `quiet` marks the readings taken with the churn paused (only the long-lived
    clients connected), the ones descriptor counts are compared at."""

    seconds: float
    rss_bytes: int
    fds: int
    threads: int
    cpu_seconds: float
    connections_open: int
    connections_accepted: int
    requests: int
    protocol_errors: int
    throttled_requests: int
    produced: int
    consumed_group: int
    consumed_fetch: int
    quiet: int = 0


def read_metrics(proxy: ProxyProcess) -> dict[str, float]:
    """The proxy's counters summed over their labels, by name without the prefix."""
    totals: dict[str, float] = {}
    for line in proxy.metrics().splitlines():
        if not line.startswith(PREFIX):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0][len(PREFIX):]
        totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def take(proxy: ProxyProcess, seconds: float, produced: int, consumed_group: int, consumed_fetch: int,
         quiet: bool = False) -> Sample:
    assert proxy.proc is not None
    p = psutil.Process(proxy.proc.pid)
    with p.oneshot():
        rss, fds, threads = p.memory_info().rss, p.num_fds(), p.num_threads()
        cpu = p.cpu_times()
    m = read_metrics(proxy)
    return Sample(
        seconds=round(seconds, 1), rss_bytes=rss, fds=fds, threads=threads,
        cpu_seconds=round(cpu.user + cpu.system, 2),
        connections_open=int(m.get("connections_open", 0)),
        connections_accepted=int(m.get("connections_accepted_total", 0)),
        requests=int(m.get("requests_total", 0)),
        protocol_errors=int(m.get("protocol_errors_total", 0)),
        throttled_requests=int(m.get("throttled_requests_total", 0)),
        produced=produced, consumed_group=consumed_group, consumed_fetch=consumed_fetch, quiet=int(quiet))


def write_csv(samples: list[Sample], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[x.name for x in fields(Sample)])
        w.writeheader()
        for s in samples:
            w.writerow(asdict(s))


def read_csv(path: Path) -> list[Sample]:
    kinds = {x.name: x.type for x in fields(Sample)}
    with open(path, newline="") as f:
        rows = [{k: (float(v) if kinds[k] == "float" else int(v)) for k, v in row.items()}
                for row in csv.DictReader(f)]
    return [Sample(**row) for row in rows]  # type: ignore[arg-type]


def plot(samples: list[Sample], warm_up_seconds: float, path: Path, title: str) -> None:
    """Four panels over time: RSS, descriptors, connections open, records a second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.seconds / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(8, 8.5), dpi=80)
    rss, fds, conns, rate = axes
    rss.plot(t, [s.rss_bytes / MiB for s in samples], color="tab:blue")
    rss.set_ylabel("RSS (MiB)")
    fds.plot(t, [s.fds for s in samples], color="tab:orange", label="all samples")
    quiet = [s for s in samples if s.quiet]
    fds.plot([s.seconds / 60 for s in quiet], [s.fds for s in quiet], "ko", label="churn paused")
    fds.set_ylabel("open fds")
    fds.legend(loc="upper left", fontsize="small")
    conns.plot(t, [s.connections_open for s in samples], color="tab:green")
    conns.set_ylabel("connections open")
    mids, produced, consumed = [], [], []
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b.seconds - a.seconds
        if dt > 0:
            mids.append((a.seconds + b.seconds) / 120)
            produced.append((b.produced - a.produced) / dt)
            consumed.append((b.consumed_fetch - a.consumed_fetch) / dt)
    rate.plot(mids, produced, color="tab:red", label="acknowledged")
    rate.plot(mids, consumed, color="tab:purple", alpha=0.7, label="read (live plain fetch)")
    rate.set_ylabel("records/s")
    rate.legend(loc="upper left", fontsize="small")
    rate.set_xlabel("minutes")
    for ax in axes:
        ax.axvspan(0, warm_up_seconds / 60, color="0.9")
        ax.grid(alpha=0.3)
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1]) * 1.15)
    rss.set_title(title + " (grey: warm-up)", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
