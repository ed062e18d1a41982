"""devkit.valkey, the real Valkey of the shared quota store's tests: standalone on TCP and on a
Unix socket, a 3-master Cluster, the faults (kill -9, SIGSTOP, restart empty or with its data),
and the fault relay in front of it (latency, TLS)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.store_script import SYNC_SCRIPT, bucket_keys, sync_args
from devkit.processes import LOOPBACK
from devkit.relay import Relay
from devkit.resp import ReplyError, ValkeyError
from devkit.valkey import ValkeyCluster, ValkeyServer, slot_ranges, tls_files


def test_answers_ping_on_tcp_and_on_a_unix_socket(valkey: ValkeyServer, valkey_unix: ValkeyServer) -> None:
    assert valkey.command("PING") == "PONG"
    assert valkey.url == f"redis://{LOOPBACK}:{valkey.port}"
    assert valkey_unix.command("PING") == "PONG"
    assert valkey_unix.socket_path is not None and valkey_unix.socket_path.is_socket()
    assert valkey_unix.url == f"unix://{valkey_unix.socket_path}"
    assert valkey_unix.info("server")["tcp_port"] == "0"  # the socket only


def test_a_password_is_required_when_set(valkey_factory: Callable[..., ValkeyServer]) -> None:
    server = valkey_factory(password="s3cret")
    assert server.command("PING") == "PONG"  # the harness authenticates
    assert server.url == f"redis://:s3cret@{LOOPBACK}:{server.port}"
    with server.connect() as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100).startswith(b"-NOAUTH")


def test_no_persistence_by_default(valkey: ValkeyServer) -> None:
    config = valkey.command("CONFIG", "GET", "*")
    settings = dict(zip(config[::2], config[1::2], strict=True))
    assert settings[b"save"] == b"" and settings[b"appendonly"] == b"no"


def test_kill_and_restart_comes_back_empty(valkey: ValkeyServer) -> None:
    valkey.command("SET", "k", "v")
    with pytest.raises(ValkeyError, match="still running"):
        valkey.restart()
    valkey.kill()
    assert valkey.stopped
    valkey.restart()
    assert valkey.command("GET", "k") is None


def test_aof_keeps_every_write_across_kill_9(valkey_factory: Callable[..., ValkeyServer]) -> None:
    server = valkey_factory(persistence="aof")
    server.command("HINCRBY", "totals", "alice", 5)
    server.kill()
    server.restart()
    assert server.command("HGET", "totals", "alice") == b"5"
    server.kill()
    server.restart(empty=True)
    assert server.command("HGET", "totals", "alice") is None


def test_rdb_keeps_what_was_saved(valkey_factory: Callable[..., ValkeyServer]) -> None:
    server = valkey_factory(persistence="rdb")
    server.command("SET", "saved", "1")
    server.save()
    server.command("SET", "unsaved", "1")
    server.kill()
    server.restart()
    assert server.command("GET", "saved") == b"1"
    assert server.command("GET", "unsaved") is None


def test_rdb_is_written_at_a_clean_stop(valkey_factory: Callable[..., ValkeyServer]) -> None:
    server = valkey_factory(persistence="rdb")
    server.command("SET", "k", "v")
    server.shutdown()
    server.restart()
    assert server.command("GET", "k") == b"v"


def test_pause_holds_answers_until_resume(valkey: ValkeyServer) -> None:
    valkey.pause()
    try:
        with pytest.raises(TimeoutError):
            valkey.command("PING", timeout=0.3)
    finally:
        valkey.resume()
    assert valkey.command("PING") == "PONG"


def test_relay_delay_adds_at_least_the_configured_latency(valkey: ValkeyServer, valkey_relay: Relay) -> None:
    through = ValkeyServer(port=valkey_relay.port)  # an address only: the relay's
    through.command("PING")
    valkey_relay.delay(0.1)
    started = time.monotonic()
    assert through.command("PING") == "PONG"
    assert time.monotonic() - started >= 0.2  # once each way
    valkey_relay.delay(0)


def test_relay_terminates_tls_with_auth_for_a_server_without_tls(
        valkey_factory: Callable[..., ValkeyServer], tmp_path: Path) -> None:
    redis = pytest.importorskip("redis.asyncio")
    server = valkey_factory(password="pw")
    files = tls_files(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    relay = Relay(server.port, tls=context).start()
    try:
        async def ping() -> bool:
            client = redis.Redis.from_url(f"rediss://:pw@{relay.address}", ssl_ca_certs=str(files.ca))
            try:
                return bool(await client.ping())
            finally:
                await client.aclose()

        assert asyncio.run(ping())
    finally:
        relay.stop()


def test_slot_ranges_cover_every_slot_once() -> None:
    assert slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)]  # as valkey-cli makes them
    covered = [s for first, last in slot_ranges(7) for s in range(first, last + 1)]
    assert covered == list(range(16384))


def test_cluster_has_three_masters_and_refuses_keys_of_two_slots(valkey_cluster: ValkeyCluster) -> None:
    nodes = valkey_cluster.nodes[0].command("CLUSTER", "NODES").decode().splitlines()
    assert sum("master" in line for line in nodes) == 3
    a, b = bucket_keys("kqp", 1, 1)[0], bucket_keys("kqp", 2, 1)[0]
    assert valkey_cluster.keyslot(a) != valkey_cluster.keyslot(b)
    with pytest.raises(ReplyError, match="CROSSSLOT"):
        valkey_cluster.node_for(a).command("EVAL", SYNC_SCRIPT, 2, a, b, *sync_args("r1", 1000, [("u:x", 1)]))
    keys = bucket_keys("kqp", 2, 1)  # one hash tag: one slot
    assert valkey_cluster.keyslot(keys[0]) == valkey_cluster.keyslot(keys[1])
    reply = valkey_cluster.node_for(keys[0]).command(
        "EVAL", SYNC_SCRIPT, 2, *keys, *sync_args("r1", 1000, [("u:x", 5), ("u:y", 7)]))
    assert reply == [5, 7]
    with pytest.raises(ReplyError, match="MOVED"):  # the wrong node redirects
        other = next(n for n in valkey_cluster.nodes if n is not valkey_cluster.node_for(keys[0]))
        other.command("HGET", keys[1], "u:x")


def test_a_killed_cluster_node_rejoins_with_its_slots_after_restart() -> None:
    cluster = ValkeyCluster().start()
    try:
        key = bucket_keys("kqp", 3, 1)[1]
        node = cluster.node_for(key)
        node.command("HSET", key, "u:x", 1)
        node.kill()
        node.restart()  # empty: no persistence, but nodes.conf keeps its slots
        cluster.wait_ok()
        assert cluster.node_for(key) is node
        assert node.command("HGET", key, "u:x") is None
    finally:
        cluster.stop()


def test_relayed_cluster_announces_the_relays(valkey_cluster_relayed: ValkeyCluster) -> None:
    cluster = valkey_cluster_relayed
    slots = cluster.nodes[0].command("CLUSTER", "SLOTS")
    announced = {int(entry[2][1]) for entry in slots}
    assert announced == {r.port for r in cluster.relays}
    assert cluster.url.endswith(f":{cluster.relays[0].port}")
    # A command through a relay reaches its node.
    key = bucket_keys("kqp", 4, 1)[0]
    i = cluster.nodes.index(cluster.node_for(key))
    through = ValkeyServer(port=cluster.relays[i].port)
    assert through.command("HSET", key, "u:x", 1) == 1
