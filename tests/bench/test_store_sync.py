"""The shared quota store's benchmarks on a tiny scale: the sync script's contract against a real
Valkey (bench.store_script), and a short run of the fleet simulation (bench.store_sync). What
the numbers are is `make bench`'s business; here they only have to be there and make sense."""

from __future__ import annotations

import pytest

from bench.store_script import SCRIPTS, bucket_keys, sync_args
from bench.store_sync import Config, rows, simulate
from devkit.valkey import ValkeyServer


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


@pytest.mark.slow
def test_a_tiny_simulation_syncs_and_measures_the_store() -> None:
    result = simulate(Config(replicas=4, tenants=200, tenants_per_replica=100, buckets=4, seconds=2.0,
                             warmup=1.0, processes=2, window_samples=2))
    assert result["errors"] == 0
    assert result["syncs"] > 0 and result["calls"] == 4 * result["syncs"]
    assert result["entity_updates"] == 100 * result["syncs"]
    assert result["server_cpu_per_entity_update_us"] > 0
    assert 0 < result["sync_latency_ms"]["p50"] <= result["sync_latency_ms"]["p99"]
    assert result["store_keys"] > 0
    assert len(rows(result)) == 11
