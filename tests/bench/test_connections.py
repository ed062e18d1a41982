"""Short versions of `make load` (bench/connections.py): a proxy process in front of Tansu holds
a thousand connections and serves them all, holds a connection flood to its connection quotas,
and keeps bounded what slow and hostile clients make it hold. Times and latencies are printed by
`make load`, never asserted here."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from bench import connections
from bench.connections import flood_config
from bench.connections_stack import MIB, stack

pytestmark = pytest.mark.integration


def run(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    return asyncio.run(coro)


def test_a_thousand_held_connections_are_all_served_beside_active_clients() -> None:
    with stack() as s:
        r = run(connections.hold(s, 1000, active=5, rate=20, seconds=2))
    assert (r["held"], r["held_failed"]) == (1000, 0)  # each answered its ApiVersions and Metadata
    assert r["with_held"]["connections_open"] == 1005
    assert r["with_held"]["broker_fds"] >= 1005  # each with its own broker connection
    assert r["active_without"]["errors"] == r["active_with"]["errors"] == 0
    assert r["active_with"]["requests"] > 0
    assert r["proxy_alive"]


def test_held_connections_spread_over_two_workers_and_are_all_served() -> None:
    with stack(workers=2) as s:
        r = run(connections.hold(s, 1000, active=5, rate=20, seconds=2))
    assert (r["workers"], r["held"], r["held_failed"]) == (2, 1000, 0)
    assert r["with_held"]["connections_open"] == 1005  # the supervisor's sum over both
    assert min(r["with_held"]["per_worker_fds"]) > 100  # both hold a share
    assert r["active_with"]["errors"] == 0
    assert r["proxy_alive"]


def test_a_connection_flood_is_held_to_the_connection_quotas() -> None:
    rate, seconds, limit, per_ip = 1000, 3.0, 50, 100
    with stack(flood_config(limit, per_ip)) as s:
        r = run(connections.flood(s, rate, seconds, limit, per_ip, active=5, active_rate=20,
                                  generators=2))
    outcomes = r["outcomes"]
    assert outcomes.get("no answer in 30 s", 0) == 0
    # Kafka's Rate over 11 one-second windows: a new sensor lets the first second run ahead
    # (its elapsed time counts as 10 windows); after that, at most the limit a second.
    assert outcomes.get("served", 0) <= limit * (seconds + 10)
    assert outcomes.get("closed", 0) > 0
    assert sum(outcomes.values()) == r["offered"]
    assert r["other_with_flood"]["errors"] == 0  # another address is not held to this one's quota
    assert r["proxy_alive"]


def test_slow_and_hostile_clients_hold_bounded_memory() -> None:
    max_frame = 4 * MIB
    with stack({"max_frame_bytes": max_frame}) as s:
        async def scenario() -> dict[str, Any]:
            await connections.fill_topic(s, 16)
            return {
                "slowloris": await connections.slowloris(s, 200, max_frame, seconds=4, interval=1.0),
                "trickle": await connections.trickle(s, max_frame, seconds=3),
                "partial": await connections.big_frames_held(s, 4, max_frame),
                "fetchers": await connections.never_reading_fetchers(s, 5, 8 * MIB, 5, seconds=3),
            }
        r = run(scenario())
    # The bounds of docs/reliability.md, with room for the allocator's and the measurement's noise.
    assert r["slowloris"]["connections_open"] == 200
    assert r["slowloris"]["proxy_bytes_per_connection"] < 64 * 1024
    assert r["trickle"]["growth_per_byte_sent"] < 4  # ~320 before FrameDecoder copied small pieces
    assert r["partial"]["growth_per_connection_over_max_frame"] < 1.5
    assert r["fetchers"]["proxy_bytes_per_connection"] < 2 * MIB
    assert all(part["proxy_alive"] for part in r.values())
