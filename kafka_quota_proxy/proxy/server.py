"""The Proxy: listeners, the stage chains, the cluster view, metrics, and orderly shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from prometheus_client import start_http_server

from kafka_quota_proxy.config import ConfigError, HostPort, Settings
from kafka_quota_proxy.config.credentials_file import load_credentials
from kafka_quota_proxy.config.identity_settings import principal_for_address
from kafka_quota_proxy.config.quota_settings import default_state_file, validate_quota_entries
from kafka_quota_proxy.config.store_settings import StoreSettings
from kafka_quota_proxy.identity.delegation_tokens import TokenOwners
from kafka_quota_proxy.identity.failures import FailureBackoff
from kafka_quota_proxy.identity.ssl_rules import SslPrincipalMapper
from kafka_quota_proxy.identity.x500 import x500_name_from_der
from kafka_quota_proxy.proxy.chain import build_pipeline
from kafka_quota_proxy.proxy.cluster import Cluster
from kafka_quota_proxy.proxy.context import ANONYMOUS
from kafka_quota_proxy.proxy.datapath.client import ClientConnection
from kafka_quota_proxy.proxy.datapath.host import HostedConnection
from kafka_quota_proxy.proxy.datapath.idle import IdleSweep
from kafka_quota_proxy.proxy.datapath.proxy_header import ProxyHeaderThenTls
from kafka_quota_proxy.proxy.datapath.splice import PipePool
from kafka_quota_proxy.proxy.datapath.splice import supported as splice_supported
from kafka_quota_proxy.proxy.file_watch import watch_files
from kafka_quota_proxy.proxy.observability.metrics import ProxyMetrics
from kafka_quota_proxy.proxy.observability.metrics_socket import MetricsSocket
from kafka_quota_proxy.proxy.observability.quota_metrics import QuotaCollector
from kafka_quota_proxy.proxy.observability.store_metrics import StoreCollector
from kafka_quota_proxy.proxy.observability.usage_log import (
    UsageCollector,
    UsageMeter,
    UsageWriter,
    default_instance,
)
from kafka_quota_proxy.proxy.quota_runtime.access import QuotaAccess, authenticates_clients, management_policy
from kafka_quota_proxy.proxy.quota_runtime.audit import QuotaAudit
from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine, ScopeManagers
from kafka_quota_proxy.proxy.reload import watch_config
from kafka_quota_proxy.proxy.stages.controller_mutations import mutation_permits
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect
from kafka_quota_proxy.proxy.stages.sasl_principals import Principals
from kafka_quota_proxy.proxy.stages.sasl_terminate import SaslTerminate
from kafka_quota_proxy.proxy.store.sync import StoreSync
from kafka_quota_proxy.proxy.tls import server_context, upstream_context, watch_certificates
from kafka_quota_proxy.proxy.token_owners import TokenOwnerLookup, ask_token_owners
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import throttle_type
from kafka_quota_proxy.quota.resolution import QuotaStore

log = logging.getLogger("kafka_quota_proxy")

CANCEL_ROUNDS = 5  # at shutdown, cancels sent to a task of the proxy's own before it is left
CANCEL_WAIT_SECONDS = 1.0  # for the tasks to end after each





class Proxy:
    """A running kafka-quota-proxy: owns every listener and client connection."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = ProxyMetrics()
        self.upstream_ssl = upstream_context(settings.upstream_tls) if settings.upstream_tls else None
        self.cluster = Cluster(settings, self._open_node_listener, self.upstream_ssl)
        self.quotas = QuotaStore()
        self.audit = QuotaAudit(
            lambda source, outcome: self.metrics.quota_changes.labels(source, outcome).inc())
        self.quota_control = QuotaControl(
            self.quotas, validate_quota_entries(settings.quotas, settings.config_path),
            default_state_file(settings.config_path, settings.quota), self.audit)
        self.quota_access = QuotaAccess(authenticates_clients(settings))
        # The quota store: the configured one, else the one a --workers supervisor started for
        # its workers (then the workers are one proxy, and scope `proxy` is shared among them).
        store = settings.store
        own_store = store is None and settings.worker is not None and settings.worker.store_url
        if own_store:
            assert settings.worker is not None and settings.worker.store_url is not None
            store = StoreSettings(url=settings.worker.store_url, key_prefix="kqp-workers")
        self.engine = QuotaEngine(settings.quota, self.quotas,
                                  shared_buckets=store.effective_buckets if store else None,
                                  share_proxy_scope=bool(own_store), leadership=self.cluster.leadership,
                                  broker_count=lambda: max(len(self.cluster.nodes), 1))
        self.cluster.wants_topics = lambda: bool(self.engine.switches().topics)
        self.store_sync: StoreSync | None = None
        if store is not None and self.engine.shared is not None:
            self.store_sync = StoreSync(store, self.engine.shared, config=self.quota_control,
                                        id_rates=self.engine.shared_id_rates, ids=self.engine.shared_ids)
            self.metrics.registry.register(StoreCollector(self.store_sync, self.engine.clock))
        self.metrics.registry.register(QuotaCollector(self.engine, lambda: self._loop))
        self.sasl_stage = self._sasl_stage(settings)
        topic_usage = settings.usage_log is not None and settings.usage_log.topics
        self.pipeline = build_pipeline(self.sasl_stage, self.quota_control, self.engine, self.cluster,
                                       self.quota_access, topic_usage=topic_usage)
        self.usage: UsageMeter | None = None
        if settings.usage_log is not None:
            u = settings.usage_log
            instance = u.instance or default_instance(settings.listen.port)
            if settings.worker is not None:  # each worker writes as an instance of its own
                instance = f"{instance}-{settings.worker.name}"
            writer = UsageWriter(u, instance)
            self.usage = UsageMeter(u, self.quotas, writer, permits=lambda ctx: mutation_permits(
                ctx.api_key, ctx.decode_request(), self.cluster.topic_partitions))
            self.engine.usage = self.usage
            self.metrics.registry.register(UsageCollector(self.usage))
        self.connections: set[HostedConnection] = set()
        # Empty pipes for moving large Fetch responses with splice(2) (datapath/splice.py).
        self.pipes = PipePool()
        self.splicing = settings.splice and splice_supported()
        self._per_ip: dict[str, int] = {}
        self.ssl_mapper = SslPrincipalMapper.from_rules(settings.ssl_principal_mapping_rules)
        self.server_ssl = server_context(settings.tls) if settings.tls else None
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False  # shutdown has begun: no new listener, no new background task
        self._unserved: set[socket.socket] = set()  # bound for a broker, its server not made yet
        self._shutting_down: asyncio.Task[None] | None = None
        self._all_closed = asyncio.Event()
        self._metrics_server: Any = None
        self._metrics_socket: MetricsSocket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "Proxy.start() has not run"
        return self._loop

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        s = self.settings
        # Workers each open the same listeners; the kernel spreads connections among them.
        server = await self.loop.create_server(
            lambda: self._accept("bootstrap", self.cluster.bootstrap_targets),
            s.listen.host, s.listen.port, reuse_address=True, reuse_port=s.worker is not None,
            backlog=1024, ssl=self._listener_ssl)
        self._servers.append(server)
        log.info("listening on %s (bootstrap) for upstream %s; clients are told host %s",
                 s.listen, ", ".join(map(str, s.upstream)), s.effective_advertised_host)
        policy, warnings = management_policy(s)
        log.info("%s", policy)
        for warning in warnings:
            log.warning("%s", warning)
        if s.worker is not None:  # the supervisor serves --metrics, merging every worker's
            self._metrics_socket = MetricsSocket(s.worker.metrics_socket, self.metrics.registry)
        elif s.metrics is not None:
            self._metrics_server, _ = start_http_server(s.metrics.port, s.metrics.host,
                                                        registry=self.metrics.registry)
            log.info("metrics at http://%s/metrics", s.metrics)
        self.spawn(self.cluster.refresh_forever())
        if self.store_sync is not None:
            st = self.store_sync.settings
            log.info("quota store %s: syncing every %d ms as replica %s", st.redacted_url,
                     st.sync_interval_ms, self.store_sync.replica)
            self.spawn(self.store_sync.run_forever())
        self.spawn(self._expire_forever())
        self.spawn(self._expire_producer_ids_forever())
        if s.connections_max_idle_ms is not None:
            self.spawn(self._close_idle_forever(s.connections_max_idle_ms / 1000))
        if self.usage is not None:
            self.usage.writer.start()
            self.spawn(self._rotate_usage_forever())
            log.info("usage log: every %ds to %s as instance %s", self.usage.settings.interval_seconds,
                     self.usage.writer.dir, self.usage.writer.instance)
        if s.sasl.mode == "terminate" and s.sasl.credentials_file is not None:
            self.spawn(self._watch_credentials(s.sasl.credentials_file))
        if s.tls is not None and self.server_ssl is not None:
            self.spawn(watch_certificates(self.server_ssl, s.tls.cert_file, s.tls.key_file,
                                           s.tls.ca_file, "listener"))
        if s.upstream_tls is not None and self.upstream_ssl is not None:
            u = s.upstream_tls
            self.spawn(watch_certificates(self.upstream_ssl, u.cert_file, u.key_file, u.ca_file,
                                           "upstream"))
        if s.config_path is not None:
            self.spawn(watch_config(s.config_path, self))

    async def _watch_credentials(self, path: str) -> None:
        """Users added or removed with `kafka-quota-proxy users` apply without a restart."""
        def reload() -> None:
            try:
                fresh = load_credentials(path)
            except ConfigError as exc:
                log.error("credentials reload refused, keeping the current users: %s", exc)
                return
            assert isinstance(self.sasl_stage, SaslTerminate)
            self.sasl_stage.store = fresh
            log.info("credentials reloaded from %s: %d user(s)", path, len(fresh.users()))

        await watch_files([path], 2.0, reload)

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(60)
            self.engine.expire()

    async def _close_idle_forever(self, max_idle: float) -> None:
        """connections_max_idle_ms: one sweep over the open connections every so often, rather
        than a timer per connection reset on every read."""
        sweep = IdleSweep(max_idle)
        while True:
            await asyncio.sleep(sweep.interval)
            for conn in sweep.expired(self.connections, self.loop.time()):
                conn.close_idle(max_idle)

    async def _expire_producer_ids_forever(self) -> None:
        """KIP-936's cache cleanup, every producer.id.quota.cache.cleanup.scheduler.interval.ms
        while some user is tracked; an idle proxy looks once a second."""
        while True:
            busy = self.engine.tracks_producer_ids()
            await asyncio.sleep(self.engine.settings.producer_ids.cleanup_interval_ms / 1000 if busy else 1.0)
            self.engine.expire_producer_ids()

    async def _rotate_usage_forever(self) -> None:
        usage = self.usage
        assert usage is not None
        while True:
            await asyncio.sleep(usage.seconds_to_boundary() + 0.001)
            usage.rotate()

    def spawn(self, coro: Any) -> bool:
        """Run `coro` as a task the proxy owns: cancelled at shutdown, and not started once the
        shutdown has begun (nothing would cancel it). Whether it was started."""
        if self._closing:
            coro.close()
            return False
        task = self.loop.create_task(coro, name=getattr(coro, "__qualname__", None))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def _open_node_listener(self, node_id: int, sock: socket.socket) -> None:
        if self._closing:
            # A Metadata response answered during the drain named a broker not listened for yet:
            # a listener opened now would outlive the shutdown's close (its wait never ended).
            sock.close()
            return

        async def serve() -> None:
            # Not serving until it is in _servers: the shutdown then closes it whenever it
            # cancels this task (asyncio's create_server yields once when it starts serving).
            server = await self.loop.create_server(
                lambda: self._accept(f"node-{node_id}", lambda: self.cluster.node_targets(node_id)),
                sock=sock, backlog=1024, ssl=self._listener_ssl, start_serving=False)
            self._servers.append(server)
            self._unserved.discard(sock)
            await server.start_serving()
        self._unserved.add(sock)  # closed by the shutdown if this task is cancelled before it ran
        self.spawn(serve())

    @property
    def _proxy_header_before_tls(self) -> bool:
        return self.settings.proxy_protocol and self.server_ssl is not None

    @property
    def _listener_ssl(self) -> ssl.SSLContext | None:
        # A PROXY header comes before the TLS handshake: TLS starts once it has been read.
        return None if self._proxy_header_before_tls else self.server_ssl

    def _accept(self, listener: str,
                targets: Callable[[], Sequence[HostPort]]) -> ClientConnection | ProxyHeaderThenTls:
        if self._proxy_header_before_tls:
            return ProxyHeaderThenTls(self, ClientConnection(self, listener, targets))
        return ClientConnection(self, listener, targets)

    def _sasl_stage(self, settings: Settings) -> SaslInspect | SaslTerminate | None:
        sasl = settings.sasl
        if sasl.mode == "passthrough":
            return SaslInspect(sasl, Principals(sasl), self._token_owners(settings))
        if sasl.mode == "terminate":
            assert sasl.credentials_file is not None
            self.credentials = load_credentials(sasl.credentials_file)
            return SaslTerminate(sasl, self.credentials, Principals(sasl), FailureBackoff(),
                                 self.engine.clock,
                                 lambda mechanism: self.metrics.auth_failures.labels(mechanism).inc())
        return None

    def _token_owners(self, settings: Settings) -> TokenOwnerLookup:
        """Delegation tokens' owners: learnt from the token responses clients get, and asked of
        the brokers as the proxy's own user (`upstream_sasl`), if it has one."""
        creds = settings.upstream_sasl
        ask = None if creds is None else partial(ask_token_owners, self.cluster.bootstrap_targets,
                                                 self.upstream_ssl, creds)
        return TokenOwnerLookup(TokenOwners(), ask, self.spawn, time.monotonic,
                                settings.connect_timeout_seconds, creds.username if creds else "")

    def identify(self, transport: asyncio.BaseTransport, ip: str) -> str:
        """The principal before any SASL: from a client certificate (mTLS), else from the
        source address (principals_by_cidr), else ANONYMOUS, as Kafka's default builder."""
        ssl_object = transport.get_extra_info("ssl_object") if self.settings.tls is not None else None
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if der:  # read from the certificate itself, so the name is exactly what Java prints
            return self.ssl_mapper.get_name(x500_name_from_der(der))
        return principal_for_address(ip, self.settings.principals_by_cidr) or ANONYMOUS

    def admit(self, conn: HostedConnection, ip: str) -> int | None:
        """None to serve a new connection; else the delay (ms) after which to close it unread."""
        conn.admitted = True
        count = self._per_ip.get(ip, 0) + 1
        self._per_ip[ip] = count
        limit = self.engine.settings.max_connections_per_ip
        if limit is not None and count > limit and self.engine.enforcing:
            return 0
        if not self.engine.active:
            return None
        delay = self.engine.connections.on_accept(ip, self.engine.clock())
        if delay > 0:
            self.engine.connection_throttles.add(throttle_type(QuotaKey.CONNECTION_CREATION_RATE), ip, "",
                                                 delay, self.engine.clock())
            if self.engine.enforcing:
                return delay
        return None

    def quota_scope(self, upstream: str) -> ScopeManagers:
        return self.engine.scope(upstream)

    def connection_opened(self, conn: HostedConnection) -> None:
        self.connections.add(conn)
        self._all_closed.clear()
        self.metrics.connections_accepted.inc()
        self.metrics.connections_open.inc()

    def connection_closed(self, conn: HostedConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.metrics.connections_closed.inc()
            self.metrics.connections_open.dec()
        if conn.admitted:
            conn.admitted = False
            left = self._per_ip.get(conn.info.ip, 1) - 1
            if left > 0:
                self._per_ip[conn.info.ip] = left
            else:
                self._per_ip.pop(conn.info.ip, None)
        if not self.connections:
            self._all_closed.set()

    async def shutdown(self) -> None:
        """Stop accepting, let in-flight requests finish, then close everything. A second call
        waits for the first one's end."""
        if self._shutting_down is None:
            self._shutting_down = self.loop.create_task(self._shut_down())
        await asyncio.shield(self._shutting_down)

    async def _shut_down(self) -> None:
        self._closing = True
        for server in self._servers:
            server.close()
        await self._cancel_tasks()
        for sock in self._unserved:
            sock.close()
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
            server.close()  # idempotent: waiting on a server still open would never end
            await server.wait_closed()
        if self.usage is not None:
            # The last, partial interval too; the writer drains its queue off the loop.
            self.usage.rotate()
            await self.loop.run_in_executor(None, self.usage.writer.close)
        if self.store_sync is not None:
            # What this replica counted last, for the others; a store that does not answer must
            # not hold the shutdown up (each call has its own timeout; this bounds them all).
            try:
                async with asyncio.timeout(2 * self.store_sync.settings.timeout_ms / 1000 + 1):
                    await self.store_sync.sync_once()
                    await self.store_sync.close()
            except TimeoutError:
                log.warning("quota store: the last sync at shutdown did not finish in time")
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        if self._metrics_socket is not None:
            self._metrics_socket.close()
        self.pipes.close()
        log.info("stopped")

    async def _cancel_tasks(self) -> None:
        """Cancel the proxy's own tasks, and cancel again any that outlive a cancel: a library
        may swallow one (Python 3.11's asyncio.wait_for returns a result that lands with the
        cancel). One that outlives them all is named in the log and left; the shutdown goes on."""
        pending = set(self._tasks)
        for _ in range(CANCEL_ROUNDS):
            if not pending:
                return
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=CANCEL_WAIT_SECONDS)
        for task in pending:
            log.warning("shutting down: task %s did not end when cancelled; leaving it",
                        task.get_name())

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.shutdown()
