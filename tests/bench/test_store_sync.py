"""The shared quota store's benchmarks on a tiny scale: the sync script's contract against a real
Valkey (bench.store_script), the proxy's own calls as the simulation sends them, and a short run
of the fleet simulation (bench.store_sync). What the numbers are is `make bench`'s business;
here they only have to be there and make sense."""

from __future__ import annotations

import time

import pytest

from bench.store_script import SCRIPTS, bucket_keys, sync_args
from bench.store_sync import (
    PLACEHOLDER,
    PLACEHOLDER_BEFORE,
    SCRIPT_CHOICES,
    Config,
    replica_requests,
    rows,
    simulate,
)
from devkit.valkey import ValkeyServer
from kafka_quota_proxy.proxy.store.scripts import SYNC_BUCKET


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_sync_script_sums_absolute_contributions_and_a_retry_counts_once(
        valkey: ValkeyServer, script: str) -> None:
    sha = valkey.command("SCRIPT", "LOAD", SCRIPTS[script]).decode()
    keys = bucket_keys("kqp", 3, 1795000000)

    def sync(replica: str, updates: list[tuple[str, int]], reads: tuple[str, ...] = ()) -> list[int]:
        return list(valkey.command("EVALSHA", sha, 2, *keys, *sync_args(replica, 5000, updates, reads)))

    assert sync("r1", [("u:alice", 100), ("u:bob", 5)]) == [100, 5]
    assert sync("r2", [("u:alice", 50)], ("u:bob", "u:nobody")) == [150, 5, 0]
    assert sync("r1", [("u:alice", 120), ("u:bob", 5)]) == [170, 5]  # absolute: +20, not +120
    assert sync("r1", [("u:alice", 120), ("u:bob", 5)]) == [170, 5]  # a retry changes nothing
    assert 0 < int(valkey.command("PTTL", keys[0])) <= 5000
    assert 0 < int(valkey.command("PTTL", keys[1])) <= 5000


def test_batched_script_handles_more_values_than_lua_unpacks_at_once(valkey: ValkeyServer) -> None:
    sha = valkey.command("SCRIPT", "LOAD", SCRIPTS["batched"]).decode()
    keys = bucket_keys("kqp", 0, 1)
    updates = [(f"u:t{i}", i) for i in range(2500)]
    assert valkey.command("EVALSHA", sha, 2, *keys, *sync_args("r1", 5000, updates)) == list(range(2500))


@pytest.mark.parametrize("tenants", [6, 2500])
def test_the_simulated_replicas_send_the_proxys_own_sync_calls(valkey: ValkeyServer, tenants: int) -> None:
    # bench.store_sync measures the script the proxy runs, called as the proxy calls it: two
    # simulated replicas' requests, sent as they are, sum in the store as two replicas' syncs do.
    # 2,500 tenants in a bucket: more than the script hands HMGET/HSET at once (1,000).
    cfg = Config(replicas=2, tenants=tenants, buckets=2, window_samples=3)
    sha = valkey.command("SCRIPT", "LOAD", SYNC_BUCKET).decode()
    current = int(time.time())
    sample, before = b"%012d" % current, b"%012d" % (current - 1)
    answers = []
    with valkey.connection() as conn:
        for replica in (0, 1):
            requests, _, entities = replica_requests(cfg, replica, sha)
            assert entities == tenants and len(requests) == 2  # every tenant, one call per bucket
            for request in requests:
                conn.sock.sendall(request.replace(PLACEHOLDER, sample).replace(PLACEHOLDER_BEFORE, before))
                answers.append(conn.reader.reply())
    # One answer per bucket call: {lost, then (the sample before, this one) per tenant}; the
    # second replica reads both replicas' 1000 bytes in this sample, none in the one before.
    first, second = answers[:2], answers[2:]
    assert [a[0] for a in answers] == [1, 1, 1, 1]  # "wrote before", yet missing: as after a restart
    assert sum(len(a) - 1 for a in first) == 2 * tenants
    assert all(a[1:] == [0, 1000] * ((len(a) - 1) // 2) for a in first)
    assert all(a[1:] == [0, 2000] * ((len(a) - 1) // 2) for a in second)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPT_CHOICES)
def test_a_tiny_simulation_syncs_and_measures_the_store(script: str) -> None:
    result = simulate(Config(replicas=4, tenants=200, tenants_per_replica=100, buckets=4, seconds=2.0,
                             warmup=1.0, processes=2, window_samples=2, script=script))
    assert result["errors"] == 0
    assert result["syncs"] > 0 and result["calls"] == 4 * result["syncs"]
    assert result["entity_updates"] == 100 * result["syncs"]
    assert result["server_cpu_per_entity_update_us"] > 0
    assert 0 < result["sync_latency_ms"]["p50"] <= result["sync_latency_ms"]["p99"]
    assert result["store_keys"] > 0
    assert len(rows(result)) == 11
