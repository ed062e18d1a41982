"""The Proxy: listeners, the stage chains, the cluster view, metrics, and orderly shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any

from prometheus_client import start_http_server

from config import Settings

from .address_stage import AddressRewrite
from .api_versions_stage import ApiVersionsGate, ApiVersionsIntersect
from .cluster import Cluster
from .connection import ClientConnection
from .metrics import ProxyMetrics
from .stages import Pipeline

log = logging.getLogger("kafka_quota_proxy")


class Proxy:
    """A running kafka-quota-proxy: owns every listener and client connection."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = ProxyMetrics()
        self.cluster = Cluster(settings, self._open_node_listener)
        self.pipeline = Pipeline(
            request=[ApiVersionsGate()],
            response=[ApiVersionsIntersect(), AddressRewrite(self.cluster.advertise)],
        )
        self.connections: set[ClientConnection] = set()
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._all_closed = asyncio.Event()
        self._metrics_server: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "Proxy.start() has not run"
        return self._loop

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        s = self.settings
        server = await self.loop.create_server(
            lambda: ClientConnection(self, "bootstrap", self.cluster.bootstrap_targets),
            s.listen.host, s.listen.port, reuse_address=True, backlog=1024)
        self._servers.append(server)
        log.info("listening on %s (bootstrap) for upstream %s; clients are told host %s",
                 s.listen, ", ".join(map(str, s.upstream)), s.effective_advertised_host)
        if s.metrics is not None:
            self._metrics_server, _ = start_http_server(s.metrics.port, s.metrics.host,
                                                        registry=self.metrics.registry)
            log.info("metrics at http://%s/metrics", s.metrics)
        self._spawn(self.cluster.refresh_forever())

    def _spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _open_node_listener(self, node_id: int, sock: socket.socket) -> None:
        async def serve() -> None:
            server = await self.loop.create_server(
                lambda: ClientConnection(self, f"node-{node_id}",
                                         lambda: self.cluster.node_targets(node_id)),
                sock=sock, backlog=1024)
            self._servers.append(server)
        self._spawn(serve())

    def connection_opened(self, conn: ClientConnection) -> None:
        self.connections.add(conn)
        self._all_closed.clear()
        self.metrics.connections_accepted.inc()
        self.metrics.connections_open.inc()

    def connection_closed(self, conn: ClientConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.metrics.connections_closed.inc()
            self.metrics.connections_open.dec()
        if not self.connections:
            self._all_closed.set()

    async def shutdown(self) -> None:
        """Stop accepting, let in-flight requests finish, then close everything."""
        for server in self._servers:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pending = len(self.connections)
        if pending:
            log.info("shutting down: draining %d connection(s), up to %.0fs", pending,
                     self.settings.shutdown_timeout_seconds)
            for conn in list(self.connections):
                conn.begin_drain()
            try:
                await asyncio.wait_for(self._all_closed.wait(), self.settings.shutdown_timeout_seconds)
            except TimeoutError:
                log.warning("shutdown timeout: closing %d connection(s) with requests in flight",
                            len(self.connections))
                for conn in list(self.connections):
                    if conn.transport is not None:
                        conn.transport.abort()
        for server in self._servers:
            await server.wait_closed()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        log.info("stopped")

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.shutdown()
