"""What `kafka-quota-proxy demo` shows: numbers gathered from the clients and the proxy's own
metrics, rendered as a rich live view (on a terminal) or as plain progress lines (otherwise).

Nothing here touches the network or starts anything; `proxy.demo` feeds it snapshots.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

PREFIX = "kafka_quota_proxy_"
RATE_WINDOW_SECONDS = 2.0


# -- numbers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientCounts:
    """What one sample client has done so far."""

    records: int = 0
    bytes: int = 0
    errors: int = 0


@dataclass(slots=True)
class ApiCounts:
    requests: float = 0.0
    bytes_in: float = 0.0  # client -> proxy (request bytes)
    bytes_out: float = 0.0  # proxy -> client (response bytes)
    latency_sum: float = 0.0
    latency_count: float = 0.0
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (le, cumulative count)

    def quantile(self, q: float) -> float | None:
        """Estimate a latency quantile from the histogram buckets, as PromQL's
        histogram_quantile does: linear interpolation inside the bucket holding the rank."""
        if not self.latency_count or not self.buckets:
            return None
        rank = q * self.latency_count
        lower, below = 0.0, 0.0
        for le, cumulative in sorted(self.buckets):
            if cumulative >= rank:
                if math.isinf(le):
                    return lower  # beyond the largest finite bucket: report its bound
                inside = cumulative - below
                return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = le, cumulative
        return lower

    @property
    def mean_latency(self) -> float | None:
        return self.latency_sum / self.latency_count if self.latency_count else None


@dataclass(slots=True)
class ProxyCounts:
    """One reading of the proxy's Prometheus registry."""

    apis: dict[str, ApiCounts] = field(default_factory=dict)
    connections_open: float = 0.0
    connections_accepted: float = 0.0
    protocol_errors: float = 0.0
    upstream_connect_failures: float = 0.0
    upstream_brokers: float = 0.0

    @property
    def requests(self) -> float:
        return sum(a.requests for a in self.apis.values())

    @property
    def bytes_in(self) -> float:
        return sum(a.bytes_in for a in self.apis.values())

    @property
    def bytes_out(self) -> float:
        return sum(a.bytes_out for a in self.apis.values())


def read_proxy_counts(registry: CollectorRegistry) -> ProxyCounts:
    """Read every kafka_quota_proxy_* sample from the registry (safe from any thread)."""
    out = ProxyCounts()

    def api(labels: Mapping[str, str]) -> ApiCounts:
        return out.apis.setdefault(labels.get("api", "?"), ApiCounts())

    for family in registry.collect():
        for s in family.samples:
            name = s.name.removeprefix(PREFIX)
            if name == "requests_total":
                api(s.labels).requests = s.value
            elif name == "request_bytes_total":
                api(s.labels).bytes_in = s.value
            elif name == "response_bytes_total":
                api(s.labels).bytes_out = s.value
            elif name == "upstream_latency_seconds_sum":
                api(s.labels).latency_sum = s.value
            elif name == "upstream_latency_seconds_count":
                api(s.labels).latency_count = s.value
            elif name == "upstream_latency_seconds_bucket":
                api(s.labels).buckets.append((float(s.labels["le"]), s.value))
            elif name == "connections_open":
                out.connections_open = s.value
            elif name == "connections_accepted_total":
                out.connections_accepted = s.value
            elif name == "protocol_errors_total":
                out.protocol_errors += s.value
            elif name == "upstream_connect_failures_total":
                out.upstream_connect_failures = s.value
            elif name == "upstream_brokers":
                out.upstream_brokers = s.value
    return out


class Rates:
    """Per-second rates of named counters over the last RATE_WINDOW_SECONDS."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS) -> None:
        self.window = window
        self._history: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, values: Mapping[str, float]) -> None:
        self._history.append((now, dict(values)))
        while len(self._history) > 2 and self._history[1][0] <= now - self.window:
            self._history.popleft()

    def __getitem__(self, key: str) -> float:
        if len(self._history) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self._history[0], self._history[-1]
        if t1 <= t0:
            return 0.0
        return max(0.0, (v1.get(key, 0.0) - v0.get(key, 0.0)) / (t1 - t0))


# -- what is shown -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Addresses:
    broker: str  # the real broker, which only the proxy talks to
    broker_node_id: int
    broker_pid: int
    bootstrap: str  # what the clients were configured with
    node_listener: str  # the proxy's listener standing for the broker
    metrics_url: str
    advertised: Mapping[int, str]  # what the clients were told, from their own metadata


@dataclass(slots=True)
class Frame:
    """Everything one refresh of the view shows."""

    elapsed: float
    seconds: float
    phase: str
    topic: str
    partitions: int
    target_rate: int
    message_bytes: int
    addresses: Addresses
    producer: ClientCounts
    consumer: ClientCounts
    proxy: ProxyCounts
    rates: Rates
    log_lines: list[str]


def client_values(producer: ClientCounts, consumer: ClientCounts, proxy: ProxyCounts) -> dict[str, float]:
    """The counters whose rates the view shows, under the names `Rates` is asked for."""
    values = {"producer.records": float(producer.records), "producer.bytes": float(producer.bytes),
              "consumer.records": float(consumer.records), "consumer.bytes": float(consumer.bytes),
              "proxy.requests": proxy.requests, "proxy.in": proxy.bytes_in, "proxy.out": proxy.bytes_out}
    for name, a in proxy.apis.items():
        values[f"api.{name}.requests"] = a.requests
        values[f"api.{name}.in"] = a.bytes_in
        values[f"api.{name}.out"] = a.bytes_out
    return values


def size(n: int) -> str:
    return f"{n // 1024:,} KiB" if n >= 1024 and n % 1024 == 0 else f"{n:,} B"


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def mb_rate(n: float) -> str:
    return f"{n / 1e6:,.2f}"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds * 1000:.2f} ms"


def _table(*columns: tuple[str, str], title: str | None = None) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", title_style="bold",
              show_edge=False, pad_edge=False, expand=False, padding=(0, 1))
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    return t


def _addresses(f: Frame) -> RenderableType:
    a = f.addresses
    told = ", ".join(f"node {n} → {addr}" for n, addr in sorted(a.advertised.items())) or "?"
    only_proxy = bool(a.advertised) and a.broker not in a.advertised.values()
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim", no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_row("Tansu broker (real)", f"[bold]{a.broker}[/]  node {a.broker_node_id}, pid {a.broker_pid}")
    t.add_row("proxy bootstrap", f"[bold cyan]{a.bootstrap}[/]  the clients' only setting")
    t.add_row(f"proxy for node {a.broker_node_id}", f"[cyan]{a.node_listener}[/]")
    verdict = "[green]✔ proxy only[/]" if only_proxy else "[red]✘ the real broker leaked[/]"
    t.add_row("clients were told", f"{told}  {verdict}")
    flow = Text.from_markup(f"producer, consumer ──▶ [cyan]proxy {a.bootstrap}[/] ──▶ "
                            f"Tansu {a.broker}")
    return Panel(Group(flow, t), title="who talks to whom", title_align="left",
                 box=box.ROUNDED, expand=False)


def _clients(f: Frame) -> Table:
    r = f.rates
    lag = max(0, f.producer.records - f.consumer.records)
    t = _table(("client", "left"), ("records", "right"), ("rec/s", "right"), ("MB/s", "right"),
               ("MB", "right"), ("errors", "right"), ("", "left"),
               title=f"clients (confluent-kafka, {size(f.message_bytes)} records) via the proxy")
    t.add_row("producer", f"{f.producer.records:,}", f"{r['producer.records']:,.0f}",
              mb_rate(r["producer.bytes"]), mb(f.producer.bytes), f"{f.producer.errors:,}",
              f"[dim]aim {f.target_rate:,}/s, acks=all[/]")
    t.add_row("consumer", f"{f.consumer.records:,}", f"{r['consumer.records']:,.0f}",
              mb_rate(r["consumer.bytes"]), mb(f.consumer.bytes), f"{f.consumer.errors:,}",
              f"[dim]{f.partitions} partitions; lag {lag:,}[/]")
    return t


def _proxy(f: Frame, max_rows: int, with_mean: bool) -> RenderableType:
    p, r = f.proxy, f.rates
    columns = [("API", "left"), ("requests", "right"), ("req/s", "right"), ("in MB/s", "right"),
               ("out MB/s", "right"), ("p50", "right"), ("p99", "right")]
    t = _table(*columns, *([("mean", "right")] if with_mean else []),
               title="proxy, from its own metrics (p50/p99" + ("/mean" if with_mean else "")
                     + ": upstream latency)")
    apis = [(name, a) for name, a in sorted(p.apis.items(), key=lambda kv: -kv[1].requests)
            if a.requests]
    shown, hidden = (apis, []) if len(apis) <= max_rows else (apis[:max_rows - 1], apis[max_rows - 1:])
    for name, a in shown:
        t.add_row(name, f"{a.requests:,.0f}", f"{r[f'api.{name}.requests']:,.0f}",
                  mb_rate(r[f"api.{name}.in"]), mb_rate(r[f"api.{name}.out"]),
                  ms(a.quantile(0.5)), ms(a.quantile(0.99)),
                  *([ms(a.mean_latency)] if with_mean else []))
    if hidden:
        t.add_row(f"[dim]{len(hidden)} more[/]", f"[dim]{sum(a.requests for _, a in hidden):,.0f}[/]")
    t.add_row("[bold]all[/]", f"[bold]{p.requests:,.0f}[/]", f"[bold]{r['proxy.requests']:,.0f}[/]",
              f"[bold]{mb_rate(r['proxy.in'])}[/]", f"[bold]{mb_rate(r['proxy.out'])}[/]")
    footer = Text.from_markup(
        f"in [bold]{mb(p.bytes_in)} MB[/], out [bold]{mb(p.bytes_out)} MB[/] · connections open "
        f"[bold]{p.connections_open:.0f}[/] (accepted {p.connections_accepted:.0f}) · "
        f"protocol errors {p.protocol_errors:.0f}\n[dim]{f.addresses.metrics_url}[/]")
    return Group(t, footer)


# Lines of the view besides the API rows and the log: heading 1, addresses 7, blank 1, clients 5,
# blank 1, proxy title+header+rule 3, "all" 1, footer 2 (lines, not counting a trailing newline).
FIXED_LINES = 21


def render(f: Frame, height: int = 100, width: int = 120) -> RenderableType:
    """The live view, fitted to `height` lines (fewer API rows, then no log, when short) and to
    `width` columns (no mean latency when narrow)."""
    remaining = max(0.0, f.seconds - f.elapsed)
    when = (f"{f.elapsed:.1f} s, {remaining:.0f} s left" if f.phase == "running"
            else f"{f.phase} ({f.elapsed:.1f} s)")
    head = Text.from_markup(f"[bold]kafka-quota-proxy demo[/] · {when} · topic {f.topic}"
                            + (" · [dim]Ctrl-C stops[/]" if f.phase == "running" else ""))
    api_rows = sum(1 for a in f.proxy.apis.values() if a.requests)
    room = height - FIXED_LINES
    spaced = room >= api_rows  # the blank lines between the sections go first when short
    room += 0 if spaced else 2
    max_rows = max(2, min(api_rows, room))
    log_room = room - max_rows - 2  # the log panel's border
    gap: list[RenderableType] = [Text("")] if spaced else []
    parts: list[RenderableType] = [head, _addresses(f), *gap, _clients(f), *gap,
                                   _proxy(f, max_rows, with_mean=width >= 90)]
    if f.log_lines and log_room >= 2:
        logs = Text("\n".join(f.log_lines[-log_room:]), style="dim", no_wrap=True, overflow="ellipsis")
        parts.append(Panel(logs, title="log", title_align="left", box=box.ROUNDED))
    return Group(*parts)


def plain_line(f: Frame) -> str:
    r, p = f.rates, f.proxy
    produce = p.apis.get("Produce")
    return (f"[{f.elapsed:5.1f}s] produced {f.producer.records:,} ({r['producer.records']:,.0f}/s, "
            f"{mb_rate(r['producer.bytes'])} MB/s) consumed {f.consumer.records:,} "
            f"({r['consumer.records']:,.0f}/s, {mb_rate(r['consumer.bytes'])} MB/s) | proxy "
            f"{r['proxy.requests']:,.0f} req/s, in {mb_rate(r['proxy.in'])} MB/s, "
            f"out {mb_rate(r['proxy.out'])} MB/s, {p.connections_open:.0f} connections, "
            f"Produce p50 {ms(produce.quantile(0.5) if produce else None)}")


def api_summary(p: ProxyCounts) -> Iterable[str]:
    for name, a in sorted(p.apis.items(), key=lambda kv: -kv[1].requests):
        if a.requests:
            yield (f"    {name:<16}{a.requests:>8,.0f} requests {mb(a.bytes_in):>7} MB in "
                   f"{mb(a.bytes_out):>7} MB out  p50 {ms(a.quantile(0.5))}")
