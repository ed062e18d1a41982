"""What `make demo` shows: the numbers of devkit.demo.counts rendered as a rich live view (on
a terminal) or as plain progress lines (otherwise), and the proxy's per-API lines of the summary.

Nothing here touches the network or starts anything; devkit.demo.run feeds it snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from devkit.demo.counts import (
    THROTTLE_WINDOW_SECONDS,
    ClientCounts,
    ProducerView,
    ProxyCounts,
    Rates,
)

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Addresses:
    """Who listens where: the real broker, the proxy's listeners, what the clients were told."""

    broker: str  # the real broker, which only the proxy talks to
    broker_node_id: int
    broker_pid: int
    bootstrap: str  # what the clients were configured with
    node_listener: str  # the proxy's listener standing for the broker
    metrics_url: str
    advertised: Mapping[int, str]  # what the clients were told, from their own metadata
    broker_name: str = "Tansu"  # or "Apache Kafka" (make demo BROKER=kafka)


@dataclass(slots=True)
class Frame:
    """Everything one refresh of the view shows."""

    elapsed: float
    seconds: float
    phase: str
    topic: str
    partitions: int
    message_bytes: int
    addresses: Addresses
    producers: list[ProducerView]
    consumer: ClientCounts
    proxy: ProxyCounts
    rates: Rates
    throttle_rates: Rates  # the same counters over THROTTLE_WINDOW_SECONDS
    log_lines: list[str]
    window_seconds: float = 10.0  # the shortest window a quota rate is measured over

    @property
    def produced(self) -> int:
        return sum(p.counts.records for p in self.producers)


def size(n: int) -> str:
    return f"{n // 1024:,} KiB" if n >= 1024 and n % 1024 == 0 else f"{n:,} B"


def mib(n: float) -> str:
    return f"{n / MIB:,.1f}"


def mib_rate(n: float | None) -> str:
    return "-" if n is None else f"{n / MIB:,.2f}"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds * 1000:.2f} ms"


def quota_text(quota: float | None) -> str:
    return "none" if quota is None else f"{quota / MIB:,.2f} MiB/s"


def proxy_throttle(f: Frame, p: ProducerView) -> tuple[float, float]:
    """The proxy's throttling of a producer lately, from its counters' deltas: throttled
    responses a second, and their average throttle in ms. (Not ms per second: the responses in
    flight together each carry a throttle, and those overlap.)"""
    n = f.throttle_rates[f"{p.key}.throttled"]
    return n, (f.throttle_rates[f"{p.key}.throttle_ms"] / n if n else 0.0)


def status(p: ProducerView, f: Frame) -> tuple[str, str]:
    """(word, rich style) for a producer: throttled (lately, or over its quota so that it will
    be), within its quota, or free."""
    q = f.proxy.quota(p.client_id)
    over = p.quota is not None and q.byte_rate is not None and q.byte_rate > p.quota
    if over or f.throttle_rates[f"{p.key}.throttled"] > 0 or p.librdkafka.max > 0:
        return "throttled", "bold red"
    if p.quota is None:
        return "no quota", "green"
    if q.throttle_ms == 0 and f.elapsed < f.window_seconds:
        return "first window", "yellow"
    return "within quota", "green"


def _table(*columns: tuple[str, str], title: str | None = None) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", title_style="bold",
              show_edge=False, pad_edge=False, expand=False, padding=(0, 1))
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    return t


def _line(markup: str, style: str = "") -> Text:
    """One line of text that never wraps (so that the view's height can be counted)."""
    t = Text.from_markup(markup, style=style)
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def _addresses(f: Frame, compact: bool) -> RenderableType:
    a = f.addresses
    told = ", ".join(f"node {n} → {addr}" for n, addr in sorted(a.advertised.items())) or "?"
    only_proxy = bool(a.advertised) and a.broker not in a.advertised.values()
    verdict = "[green]✔ proxy only[/]" if only_proxy else "[red]✘ the real broker leaked[/]"
    flow = (f"{'clients' if compact else 'producers, consumer'} ──▶ [cyan]proxy {a.bootstrap}[/] "
            f"──▶ {a.broker_name} {a.broker}"
            f"{f' (pid {a.broker_pid})' if compact else ''}")
    if compact:  # two lines
        return Group(_line(flow), _line(f"[dim]clients were told[/] {told}  {verdict}"))
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim", no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_row(f"{a.broker_name} broker (real)",
              f"[bold]{a.broker}[/]  node {a.broker_node_id}, pid {a.broker_pid}")
    t.add_row("proxy bootstrap", f"[bold cyan]{a.bootstrap}[/]  the clients' only setting")
    t.add_row(f"proxy for node {a.broker_node_id}", f"[cyan]{a.node_listener}[/]")
    t.add_row("clients were told", f"{told}  {verdict}")
    return Panel(Group(Text.from_markup(flow), t), title="who talks to whom", title_align="left",
                 box=box.ROUNDED, expand=False)


ADDRESS_LINES = {False: 7, True: 2}  # the panel (5 lines and its border), or two lines


def _clients(f: Frame) -> RenderableType:
    r = f.rates
    lag = max(0, f.produced - f.consumer.records)
    t = _table(("client", "left"), ("records", "right"), ("rec/s", "right"), ("MiB/s", "right"),
               ("MiB", "right"), ("errors", "right"), ("", "left"))
    for p in f.producers:
        t.add_row(p.client_id, f"{p.counts.records:,}", f"{r[f'{p.key}.records']:,.0f}",
                  mib_rate(r[f"{p.key}.bytes"]), mib(p.counts.bytes), f"{p.counts.errors:,}",
                  f"[dim]{p.note}[/]")
    t.add_row("consumer", f"{f.consumer.records:,}", f"{r['consumer.records']:,.0f}",
              mib_rate(r["consumer.bytes"]), mib(f.consumer.bytes), f"{f.consumer.errors:,}",
              f"[dim]lag {lag:,}[/]")
    return Group(_line(f"[bold]clients[/] ({size(f.message_bytes)} records, acks=all) via the proxy"), t)


def _quotas(f: Frame) -> RenderableType:
    r = f.rates
    t = _table(("client-id", "left"), ("quota", "right"), ("now", "right"), ("proxy", "right"),
               ("thr/s", "right"), ("avg ms", "right"), ("librdkafka", "right"), ("", "left"))
    for p in f.producers:
        q = f.proxy.quota(p.client_id)
        word, style = status(p, f)
        per_s, avg = proxy_throttle(f, p)
        quota = "none" if p.quota is None else mib_rate(p.quota)
        t.add_row(p.client_id, quota, mib_rate(r[f"{p.key}.bytes"]), mib_rate(q.byte_rate),
                  f"{per_s:,.1f}", f"{avg:,.0f}", f"{p.librdkafka.max:,.0f}", f"[{style}]{word}[/]")
    title = _line(f"[bold]quotas[/] (MiB/s) · last {THROTTLE_WINDOW_SECONDS:.0f} s throttles: thr/s, "
                  "avg ms (proxy), max ms (librdkafka)")
    return Group(title, t)


def _quota_note(f: Frame) -> Text:
    return _line(f"[dim]now: acked by the broker · proxy: measured over ≥{f.window_seconds:.0f} s "
                 "windows, as Kafka[/]")


def _proxy(f: Frame, max_rows: int, with_mean: bool) -> RenderableType:
    p, r = f.proxy, f.rates
    columns = [("API", "left"), ("requests", "right"), ("req/s", "right"), ("in MiB/s", "right"),
               ("out MiB/s", "right"), ("p50", "right"), ("p99", "right")]
    t = _table(*columns, *([("mean", "right")] if with_mean else []),
               title="proxy, from its own metrics (p50/p99" + ("/mean" if with_mean else "")
                     + ": upstream latency)")
    apis = [(name, a) for name, a in sorted(p.apis.items(), key=lambda kv: -kv[1].requests)
            if a.requests]
    shown, hidden = (apis, []) if len(apis) <= max_rows else (apis[:max_rows - 1], apis[max_rows - 1:])
    for name, a in shown:
        t.add_row(name, f"{a.requests:,.0f}", f"{r[f'api.{name}.requests']:,.0f}",
                  mib_rate(r[f"api.{name}.in"]), mib_rate(r[f"api.{name}.out"]),
                  ms(a.quantile(0.5)), ms(a.quantile(0.99)),
                  *([ms(a.mean_latency)] if with_mean else []))
    if hidden:
        t.add_row(f"[dim]{len(hidden)} more[/]", f"[dim]{sum(a.requests for _, a in hidden):,.0f}[/]")
    t.add_row("[bold]all[/]", f"[bold]{p.requests:,.0f}[/]", f"[bold]{r['proxy.requests']:,.0f}[/]",
              f"[bold]{mib_rate(r['proxy.in'])}[/]", f"[bold]{mib_rate(r['proxy.out'])}[/]")
    footer = Group(
        _line(f"in [bold]{mib(p.bytes_in)} MiB[/], out [bold]{mib(p.bytes_out)} MiB[/] · connections "
              f"[bold]{p.connections_open:.0f}[/] open ({p.connections_accepted:.0f} accepted) · "
              f"protocol errors {p.protocol_errors:.0f}"),
        _line(f"[dim]{f.addresses.metrics_url}[/]"))
    return Group(t, footer)


def _fixed_lines(f: Frame, compact: bool, spaced: bool, note: bool) -> int:
    """Lines of the view besides the API rows and the log: heading 1, addresses, clients (title,
    header, rule, a row per client), quotas (the same, a row per producer, and its note), proxy
    (title, header, rule, "all", 2 footer lines), and the blank lines between sections."""
    return (1 + ADDRESS_LINES[compact] + 3 + len(f.producers) + 1 + 3 + len(f.producers)
            + (1 if note else 0) + 6 + (3 if spaced else 0))


def render(f: Frame, height: int = 100, width: int = 120) -> RenderableType:
    """The live view, fitted to `height` lines and `width` columns. When short, it gives up, in
    order: the log, the blank lines between sections, the address panel (for two lines), API
    rows (down to two), then the note under the quotas. When narrow, the mean latency."""
    remaining = max(0.0, f.seconds - f.elapsed)
    when = (f"{f.elapsed:.1f} s, {remaining:.0f} s left" if f.phase == "running"
            else f"{f.phase} ({f.elapsed:.1f} s)")
    head = _line(f"[bold]kafka-quota-proxy demo[/] · {when} · {f.topic}"
                 + (" · [dim]Ctrl-C stops[/]" if f.phase == "running" else ""))
    api_rows = sum(1 for a in f.proxy.apis.values() if a.requests)
    layouts = [(False, True, True), (False, False, True), (True, False, True), (True, False, False)]
    fits = [lay for want in (max(2, api_rows), 2) for lay in layouts
            if height - _fixed_lines(f, *lay) >= want]  # all the API rows, else two
    compact, spaced, note = fits[0] if fits else layouts[-1]
    room = height - _fixed_lines(f, compact, spaced, note)
    max_rows = max(2, min(api_rows, room))
    log_room = room - max_rows - 2  # the log panel's border
    gap: list[RenderableType] = [Text("")] if spaced else []
    parts: list[RenderableType] = [head, _addresses(f, compact), *gap, _clients(f), *gap, _quotas(f),
                                   *([_quota_note(f)] if note else []), *gap,
                                   _proxy(f, max_rows, with_mean=width >= 90)]
    if f.log_lines and log_room >= 2:
        logs = Text("\n".join(f.log_lines[-log_room:]), style="dim", no_wrap=True, overflow="ellipsis")
        parts.append(Panel(logs, title="log", title_align="left", box=box.ROUNDED))
    return Group(*parts)


def plain_line(f: Frame) -> str:
    r, p = f.rates, f.proxy
    producers = []
    for pv in f.producers:
        q = p.quota(pv.client_id)
        text = (f"{pv.client_id} {mib_rate(r[f'{pv.key}.bytes'])} MiB/s "
                f"({pv.counts.records:,} acked; quota {quota_text(pv.quota)}, proxy measures "
                f"{mib_rate(q.byte_rate)}")
        per_s, avg = proxy_throttle(f, pv)
        text += (f", throttled {per_s:,.1f} responses/s of {avg:,.0f} ms on average, librdkafka "
                 f"max {pv.librdkafka.max:,.0f} ms)" if per_s > 0 or pv.librdkafka.max > 0
                 else ", not throttled)")
        producers.append(text)
    return (f"[{f.elapsed:5.1f}s] " + " | ".join(producers)
            + f" | consumed {f.consumer.records:,} ({mib_rate(r['consumer.bytes'])} MiB/s)"
            f" | proxy {r['proxy.requests']:,.0f} req/s, {p.connections_open:.0f} connections")


def api_summary(p: ProxyCounts) -> Iterable[str]:
    for name, a in sorted(p.apis.items(), key=lambda kv: -kv[1].requests):
        if a.requests:
            yield (f"    {name:<16}{a.requests:>8,.0f} requests {mib(a.bytes_in):>7} MiB in "
                   f"{mib(a.bytes_out):>7} MiB out  p50 {ms(a.quantile(0.5))}")
