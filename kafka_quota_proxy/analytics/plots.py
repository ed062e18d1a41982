"""The report's plots, drawn with matplotlib's Agg canvas (no display, no pyplot state) into PNG bytes.

Inputs are small pandas frames the report collected: hourly series of a few tenants, replayed
throttle totals, hour-of-day means.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

_UNITS = ((1024 ** 3, "GiB/s"), (1024 ** 2, "MiB/s"), (1024, "KiB/s"), (1, "B/s"))
COLOURS = {"usage": "#1f77b4", "peak": "#9ecae1", "recorded": "#d62728", "current": "#ff7f0e",
           "candidate": "#2ca02c"}


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def byte_unit(largest: float) -> tuple[float, str]:
    """The binary unit that shows `largest` B/s as a number between 1 and 1024."""
    return next(((scale, name) for scale, name in _UNITS if largest >= scale), _UNITS[-1])


@dataclass
class TenantSeries:
    """One tenant's hourly usage of one kind and the quotas to draw against it."""

    label: str
    hours: pd.Series  # datetime64, UTC
    mean: pd.Series  # B/s over the hour
    peak: pd.Series  # the highest interval rate in the hour, B/s
    recorded_quota: pd.Series  # the quota the log recorded as in force (NaN: none)
    quotas: dict[str, float | None] = field(default_factory=dict)  # scenario -> a constant quota


def usage_against_quota(series: list[TenantSeries], title: str) -> bytes:
    """Small multiples, one per tenant: hourly mean and peak rate, and the quotas."""
    if not series:
        return _message(title, "no tenant has usage of this kind")
    largest = max([float(np.nanmax(s.peak.to_numpy(dtype=float), initial=0)) for s in series]
                  + [q for s in series for q in s.quotas.values() if q is not None]
                  + [float(np.nanmax(s.recorded_quota.to_numpy(dtype=float), initial=0)) for s in series])
    scale, unit = byte_unit(largest)
    cols = 2 if len(series) > 1 else 1
    rows = math.ceil(len(series) / cols)
    fig = Figure(figsize=(12, 2.8 * rows + 1.1), layout="constrained")
    fig.suptitle(title, fontsize=13)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
    for ax, s in zip(axes.flat, series, strict=False):
        ax.plot(s.hours, s.peak / scale, color=COLOURS["peak"], lw=1, label="peak interval rate")
        ax.plot(s.hours, s.mean / scale, color=COLOURS["usage"], lw=1.6, label="hourly mean rate")
        if s.recorded_quota.notna().any():
            ax.step(s.hours, s.recorded_quota / scale, where="post", color=COLOURS["recorded"], lw=1.4,
                    label="quota in force (recorded)")
        for scenario, quota in s.quotas.items():
            if quota is not None:
                ax.axhline(quota / scale, color=COLOURS.get(scenario, "grey"), ls="--", lw=1.4,
                           label=f"{scenario} quota")
        ax.set_title(s.label, fontsize=10)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    for ax in list(axes.flat)[len(series):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("time (UTC)")
    handles: dict[str, Artist] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=len(handles))
    return _png(fig)


def _duration_unit(largest_ms: float) -> tuple[float, str]:
    for scale, name in ((3_600_000, "h"), (60_000, "min"), (1000, "s")):
        if largest_ms >= 2 * scale:
            return scale, name
    return 1, "ms"


def _duration_label(ms: float) -> str:
    for scale, unit in ((3_600_000, "h"), (60_000, "min"), (1000, "s")):
        if ms >= scale:
            return f"{ms / scale:.1f} {unit}"
    return f"{ms:.0f} ms"


def throttle_before_after(frame: pd.DataFrame, current: str, candidate: str, title: str) -> bytes:
    """Horizontal bars per tenant (frame: label, current_ms, candidate_ms): replayed throttle time."""
    if frame.empty or not (frame["current_ms"].sum() or frame["candidate_ms"].sum()):
        return _message(title, "no tenant is throttled in either scenario")
    scale, unit = _duration_unit(float(max(frame["current_ms"].max(), frame["candidate_ms"].max())))
    fig = Figure(figsize=(11, 0.42 * len(frame) + 1.8), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(frame))
    for offset, column, colour, name in ((-0.2, "current_ms", COLOURS["current"], current),
                                         (0.2, "candidate_ms", COLOURS["candidate"], candidate)):
        bars = ax.barh(y + offset, frame[column] / scale, height=0.4, color=colour, label=name)
        ax.bar_label(bars, labels=[_duration_label(v) for v in frame[column]], padding=3, fontsize=8)
    ax.margins(x=0.12)
    ax.set_yticks(y, frame["label"])
    ax.invert_yaxis()
    ax.set_xlabel(f"throttle time over the log, replayed ({unit})")
    ax.set_title(title, fontsize=12)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right")
    return _png(fig)


def hour_of_day_heatmap(frame: pd.DataFrame, title: str) -> bytes:
    """Rows: tenants (index: label), columns: hour of day 0-23, values: mean B/s; each row drawn
    relative to its own busiest hour, so that shapes compare across tenants of any size."""
    if frame.empty:
        return _message(title, "no usage")
    values = frame.to_numpy(dtype=float)
    peak = values.max(axis=1, keepdims=True)
    relative = np.divide(values, peak, out=np.zeros_like(values), where=peak > 0)
    fig = Figure(figsize=(11, 0.32 * len(frame) + 1.8), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(relative, aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_yticks(range(len(frame)), list(frame.index))
    ax.set_xticks(range(0, 24, 2), [f"{h:02d}" for h in range(0, 24, 2)])
    ax.set_xlabel("hour of day (UTC)")
    ax.set_title(title, fontsize=12)
    fig.colorbar(image, ax=ax, label="mean rate / the tenant's busiest hour")
    return _png(fig)


def _message(title: str, text: str) -> bytes:
    fig = Figure(figsize=(8, 1.6), layout="constrained")
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title, fontsize=12)
    ax.text(0.5, 0.4, text, ha="center", va="center", fontsize=11)
    return _png(fig)
