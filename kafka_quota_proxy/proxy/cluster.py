"""The brokers behind the proxy, and one proxy listener per broker.

Routing is port per broker: the bootstrap listener forwards to any configured upstream, and the
listener for node N (at `Settings.node_port(N)`) always forwards to broker N. Brokers are learnt
from every address-carrying response that passes through and from the proxy's own periodic
Metadata request, so a broker that joins later gets its listener before any client is told of it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import uuid
from collections.abc import Callable
from typing import Any

from kafka_quota_proxy.config import HostPort, Settings
from kafka_quota_proxy.config.identity_settings import UpstreamSaslSettings
from kafka_quota_proxy.protocol import bootstrap
from kafka_quota_proxy.protocol.error_codes import UNKNOWN_TOPIC_OR_PARTITION
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.proxy.upstream_auth import open_upstream, read_frame
from kafka_quota_proxy.quota.topics import Leadership

log = logging.getLogger("kafka_quota_proxy.cluster")


class RoutingError(ProtocolError):
    """No broker address is known for a node a client asked for."""

    kind = "routing"


class Cluster:
    """Node id -> real broker address, and the listener that stands for each node."""

    def __init__(self, settings: Settings, open_listener: Callable[[int, socket.socket], None],
                 upstream_ssl: ssl.SSLContext | None = None) -> None:
        self.settings = settings
        self.upstream_ssl = upstream_ssl
        self.nodes: dict[int, HostPort] = {}
        self._open_listener = open_listener
        self._listening: set[int] = set()
        self._bootstrap_next = 0
        self.topics: dict[str, int] = {}  # partition counts, from Metadata responses seen
        # Which broker leads each partition, for topic quotas' split; brokers are named by the
        # address a connection forwards to (ConnectionInfo.upstream), the quota scope's key.
        self.leadership = Leadership()
        # Whether the proxy's own Metadata request asks for every topic's leaders (while topic
        # quotas are configured), or for the brokers only.
        self.wants_topics: Callable[[], bool] = lambda: False

    def observe_metadata(self, msg: Any) -> None:
        """A Metadata response on its way to a client (or the proxy's own): partition counts,
        and the leaders of every partition."""
        # A broker's bytes are not trusted: a null host (found by the fuzzer) names nobody.
        addresses = {b.node_id: str(HostPort(b.host, b.port)) for b in msg.brokers or ()
                     if isinstance(b.host, str)}
        for node_id, address in self.nodes.items():
            addresses.setdefault(node_id, str(address))
        for topic in msg.topics or ():
            if not topic.name:
                continue
            if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
                self.topics.pop(topic.name, None)
                self.leadership.forget(topic.name)
            elif topic.error_code == 0:
                partitions = topic.partitions or ()
                self.topics[topic.name] = len(partitions)
                topic_id = getattr(topic, "topic_id", None)  # v10+
                leaders = [addresses.get(p.leader_id) if p.leader_id >= 0 else None for p in partitions]
                self.leadership.observe(topic.name, leaders,
                                        topic_id.bytes if isinstance(topic_id, uuid.UUID) else None)

    def topic_partitions(self, name: str) -> int | None:
        return self.topics.get(name)

    # The AddressMapper used by the address-rewriting stage.
    def advertise(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        real = HostPort(host, port)
        if self.nodes.get(node_id) != real:
            if node_id in self.nodes:
                log.info("broker %d moved from %s to %s", node_id, self.nodes[node_id], real)
            self.nodes[node_id] = real
        proxy_port = self.settings.node_port(node_id)
        if not 1 <= proxy_port <= 65535:
            raise RoutingError(f"broker {node_id} maps to port {proxy_port}, outside 1..65535; "
                               f"set node_port_base lower or pin it under node_ports")
        taken = {self.settings.listen.port: "the bootstrap listener"}
        if self.settings.metrics is not None:
            taken[self.settings.metrics.port] = "the metrics endpoint"
        if proxy_port in taken:
            raise RoutingError(f"broker {node_id} maps to port {proxy_port}, which is "
                               f"{taken[proxy_port]}; pin another under node_ports")
        if node_id not in self._listening:
            self._listen(node_id, proxy_port)
        return self.settings.effective_advertised_host, proxy_port

    def _listen(self, node_id: int, port: int) -> None:
        # Bound synchronously, before the response naming this port reaches the client: the
        # client's connection then waits in the backlog even if the server starts a moment later.
        host = self.settings.listen.host
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, kind, proto, _, addr = infos[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.settings.worker is not None:  # every worker listens for every broker
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind(addr)
                sock.listen(512)
                sock.setblocking(False)
            except OSError:
                sock.close()
                raise
        except OSError as exc:
            log.error("cannot listen for broker %d on %s:%d: %s (clients told of this broker will "
                      "fail to reach it; free the port or pin another under node_ports)",
                      node_id, host, port, exc.strerror or exc)
            return
        self._listening.add(node_id)
        log.info("listening on %s:%d for broker %d at %s", host, port, node_id, self.nodes[node_id])
        self._open_listener(node_id, sock)

    def bootstrap_targets(self) -> list[HostPort]:
        """The configured upstreams, starting at a rotating position to spread connections."""
        ups = list(self.settings.upstream)
        start = self._bootstrap_next % len(ups)
        self._bootstrap_next += 1
        return ups[start:] + ups[:start]

    def node_targets(self, node_id: int) -> list[HostPort]:
        found = self.nodes.get(node_id)
        return [found] if found is not None else []

    async def refresh_forever(self) -> None:
        """Learn the brokers now and every metadata_refresh_seconds; retry while unreachable."""
        delay = 1.0
        reachable: bool | None = None
        while True:
            try:
                brokers = await self.fetch_brokers()
            except (TimeoutError, OSError, ProtocolError) as exc:
                level = logging.WARNING if reachable is not False else logging.DEBUG
                log.log(level, "cannot reach any upstream broker (%s): retrying every few seconds; "
                        "the proxy keeps accepting clients meanwhile", exc)
                reachable = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if not reachable:
                log.info("upstream cluster reached: %s", ", ".join(
                    f"broker {n} at {h}:{p}" for n, h, p in brokers) or "no brokers")
            reachable = True
            delay = 1.0
            for node_id, host, port in brokers:
                try:
                    self.advertise(node_id, host, port)
                except RoutingError as exc:
                    log.error("%s", exc)
            await asyncio.sleep(self.settings.metadata_refresh_seconds)

    async def fetch_brokers(self) -> list[tuple[int, str, int]]:
        errors: list[str] = []
        for target in self.bootstrap_targets():
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
                # lands as the inner call completes, and refresh_forever then slept through
                # shutdown for a whole metadata_refresh_seconds.
                async with asyncio.timeout(self.settings.connect_timeout_seconds):
                    return await self._ask(target)
            except (TimeoutError, OSError, ProtocolError) as exc:
                errors.append(f"{target}: {exc or type(exc).__name__}")
        raise OSError("; ".join(errors))

    async def _ask(self, target: HostPort) -> list[tuple[int, str, int]]:
        msg = await ask_metadata(target, self.upstream_ssl, self.settings.upstream_sasl, self.wants_topics())
        self.observe_metadata(msg)
        return [(b.node_id, b.host, b.port) for b in msg.brokers]


async def ask_metadata(target: HostPort, ssl_ctx: ssl.SSLContext | None = None,
                       creds: UpstreamSaslSettings | None = None, all_topics: bool = False) -> Any:
    """A Metadata response from one broker: every broker, and every topic if asked."""
    reader, writer = await open_upstream(target.host, target.port, ssl_ctx, creds)
    try:
        writer.write(bootstrap.api_versions_request(1))
        version = bootstrap.metadata_version(await read_frame(reader), 1)
        writer.write(bootstrap.metadata_request(2, version, all_topics))
        return bootstrap.metadata_response(await read_frame(reader), 2, version)
    finally:
        writer.close()



async def ask_brokers(target: HostPort, ssl_ctx: ssl.SSLContext | None = None,
                      creds: UpstreamSaslSettings | None = None) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every broker, asked of one broker."""
    msg = await ask_metadata(target, ssl_ctx, creds)
    return [(b.node_id, b.host, b.port) for b in msg.brokers]
