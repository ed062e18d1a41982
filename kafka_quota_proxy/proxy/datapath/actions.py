"""What a connection's core (core.py) asks of its shell (client.py), in the order it asks: frames
to the broker, bytes to the client, reading paused or resumed, a wait until a time or on work
done elsewhere, waits called off, the end. The shell carries each out as it comes; tests read
them (tests/proxy/datapath/test_core.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_quota_proxy.config import Settings
from kafka_quota_proxy.proxy.chain import Pipeline, Response
from kafka_quota_proxy.proxy.datapath.read_gate import Pause
from kafka_quota_proxy.proxy.observability.metrics import ProxyMetrics
from kafka_quota_proxy.proxy.observability.usage_log import UsageMeter
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect
from kafka_quota_proxy.proxy.stages.sasl_terminate import SaslTerminate


class CoreHost(Protocol):
    """What the core needs of the proxy: its settings, stages, metrics and usage meter."""

    settings: Settings
    metrics: ProxyMetrics
    pipeline: Pipeline
    usage: UsageMeter | None
    sasl_stage: SaslInspect | SaslTerminate | None


@dataclass(slots=True)
class ToBroker:
    """Write these frames (or their parts) to the broker, in order."""

    parts: list[bytes | memoryview]


@dataclass(slots=True)
class ToClient:
    """Write this to the client (unless the connection is closing)."""

    data: Response


@dataclass(slots=True)
class Reading:
    """Read from the client again (`on`), or stop reading from it."""

    on: bool


@dataclass(slots=True)
class WaitUntil:
    """Call `waited(reason, now)` at `until` (loop time); a later wait for the same reason
    replaces the earlier."""

    reason: Pause
    until: float


@dataclass(slots=True)
class AwaitWork:
    """Call `settled(token, problem, now)` once `work` (a future) is done: `problem` its
    exception, a cancellation's included, or None."""

    reason: Pause
    work: Any
    token: int


class Signal:
    """An action with nothing to say but itself."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


CANCEL_WAITS = Signal("CANCEL_WAITS")  # no `WaitUntil` is to end: forget their timers
LINGER = Signal("LINGER")  # drained: half-close after the last response (client.py, `_linger`)
CLOSE = Signal("CLOSE")  # close the connection (what was written before still goes out)

Action = ToBroker | ToClient | Reading | WaitUntil | AwaitWork | Signal
READ_ON = Reading(True)
READ_OFF = Reading(False)


class EmittedReading:
    """The client's reading as the core's `ReadGate` pauses it: by emitting `Reading`, which the
    shell carries out on its transport (where that is not closing)."""

    __slots__ = ("emit",)

    def __init__(self, emit: Callable[[Action], None]) -> None:
        self.emit = emit

    def pause_reading(self) -> None:
        self.emit(READ_OFF)

    def resume_reading(self) -> None:
        self.emit(READ_ON)

    def is_closing(self) -> bool:
        return False
