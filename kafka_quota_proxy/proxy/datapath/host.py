"""What a client connection needs from the proxy that accepted it: a Protocol, so that the data
path does not import the server (server.Proxy is the one implementation)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Coroutine, Hashable
from typing import Any, Protocol

from kafka_quota_proxy.config import Settings
from kafka_quota_proxy.proxy.chain import Pipeline
from kafka_quota_proxy.proxy.context import ConnectionInfo
from kafka_quota_proxy.proxy.datapath.splice import PipePool
from kafka_quota_proxy.proxy.observability.metrics import ProxyMetrics
from kafka_quota_proxy.proxy.observability.usage_log import UsageMeter
from kafka_quota_proxy.proxy.quota_runtime.engine import ScopeManagers
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect
from kafka_quota_proxy.proxy.stages.sasl_terminate import SaslTerminate


class HostedConnection(Protocol):
    """A client connection as the proxy keeps it: counted per client address, closed when idle
    (idle.py), drained at shutdown."""

    info: ConnectionInfo
    admitted: bool
    transport: asyncio.Transport | None

    def begin_drain(self) -> None: ...

    def io_mark(self) -> Hashable: ...

    def owed(self) -> bool: ...

    def close_idle(self, max_idle: float) -> None: ...


class ConnectionHost(Protocol):
    """The proxy as its connections see it: settings, the stage chains, metrics, admission."""

    settings: Settings
    metrics: ProxyMetrics
    pipeline: Pipeline
    usage: UsageMeter | None
    sasl_stage: SaslInspect | SaslTerminate | None
    upstream_ssl: ssl.SSLContext | None
    server_ssl: ssl.SSLContext | None
    splicing: bool
    pipes: PipePool

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> bool: ...

    def identify(self, transport: asyncio.BaseTransport, ip: str) -> str: ...

    def admit(self, conn: HostedConnection, ip: str) -> int | None: ...

    def quota_scope(self, upstream: str) -> ScopeManagers:
        """The quota managers a connection forwarding to `upstream` is charged to."""
        ...

    def connection_opened(self, conn: HostedConnection) -> None: ...

    def connection_closed(self, conn: HostedConnection) -> None: ...
