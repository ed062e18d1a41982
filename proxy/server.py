"""The Proxy: listeners, the stage chains, the cluster view, metrics, and orderly shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any

from prometheus_client import start_http_server

from config import Settings
from config.quota_settings import default_state_file, validate_quota_entries
from quota.resolution import QuotaStore

from .address_stage import AddressRewrite
from .api_versions_stage import ApiVersionsGate, ApiVersionsIntersect
from .cluster import Cluster
from .connection import ClientConnection
from .metrics import ProxyMetrics
from .quota_admin_stage import SERVED, ClientQuotasApi
from .quota_control import QuotaControl
from .quota_engine import QuotaEngine
from .quota_metrics import QuotaCollector
from .quota_stages import QuotaCharge, QuotaSettle, ThrottleMerge
from .reload import watch_config
from .stages import Pipeline

log = logging.getLogger("kafka_quota_proxy")


class Proxy:
    """A running kafka-quota-proxy: owns every listener and client connection."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = ProxyMetrics()
        self.cluster = Cluster(settings, self._open_node_listener)
        self.quotas = QuotaStore()
        self.quota_control = QuotaControl(
            self.quotas, validate_quota_entries(settings.quotas, settings.config_path),
            default_state_file(settings.config_path, settings.quota))
        self.engine = QuotaEngine(settings.quota, self.quotas)
        self.metrics.registry.register(QuotaCollector(self.engine))
        self.pipeline = Pipeline(
            request=[ApiVersionsGate(), ClientQuotasApi(self.quota_control, self.engine),
                     QuotaCharge(self.engine, self.cluster.topic_partitions)],
            response=[ApiVersionsIntersect(served=SERVED),
                      AddressRewrite(self.cluster.advertise, self.cluster.observe_metadata),
                      QuotaSettle(self.engine), ThrottleMerge()],
        )
        self.connections: set[ClientConnection] = set()
        self._per_ip: dict[str, int] = {}
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
        self._spawn(self._expire_forever())
        if s.config_path is not None:
            self._spawn(watch_config(s.config_path, self))

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(60)
            self.engine.expire()

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

    def admit(self, conn: ClientConnection, ip: str) -> int | None:
        """None to serve a new connection; else the delay (ms) after which to close it unread."""
        count = self._per_ip.get(ip, 0) + 1
        self._per_ip[ip] = count
        limit = self.engine.settings.max_connections_per_ip
        if limit is not None and count > limit and self.engine.enforcing:
            return 0
        if not self.engine.active:
            return None
        delay = self.engine.connections.on_accept(ip, self.engine.clock())
        if delay > 0:
            self.engine.connection_throttles.add("connection_creation_rate", ip, "", delay,
                                                 self.engine.clock())
            if self.engine.enforcing:
                return delay
        return None

    def connection_opened(self, conn: ClientConnection) -> None:
        self.connections.add(conn)
        self._all_closed.clear()
        self.metrics.connections_accepted.inc()
        self.metrics.connections_open.inc()

    def connection_closed(self, conn: ClientConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            ip = conn.peer_ip
            left = self._per_ip.get(ip, 1) - 1
            if left > 0:
                self._per_ip[ip] = left
            else:
                self._per_ip.pop(ip, None)
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
