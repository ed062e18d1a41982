"""The usage log end to end in process: real stages and connections, a scripted broker, the
records read back from the files the proxy wrote when it shut down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.proxy.conftest import running
from tests.proxy.quota_support import (
    Script,
    connect,
    create_topics,
    fetch,
    fetch_response,
    freeze,
    list_groups,
    produce,
    records_for_fetch_size,
    run,
)
from tests.support.usage import usage_records


def records(directory: Path) -> list[dict[str, Any]]:
    return usage_records(directory, "t")


def totals(recs: list[dict[str, Any]], user: str, client_id: str) -> dict[str, Any]:
    """A tenant's records summed (a run may straddle an interval boundary)."""
    mine = [r for r in recs if (r["user"], r["client_id"]) == (user, client_id)]
    assert mine, f"no record for {user}/{client_id}"
    out: dict[str, Any] = {k: sum(r[k] for r in mine) for k in ("produce_bytes", "fetch_bytes",
                                                                  "new_producer_ids", "partitions_mutated",
                                                                  "connections")}
    for nested in ("requests", "throttle_ms", "throttled"):
        out[nested] = {k: sum(r[nested][k] for r in mine) for k in mine[0][nested]}
    out["quotas"] = mine[-1]["quotas"]
    out["request_time_ms"] = sum(r["request_time_ms"] for r in mine)
    return out


def test_usage_is_logged_per_tenant_even_without_quotas(tmp_path: Path) -> None:
    script = Script()
    script.fetch_records = records_for_fetch_size(11, 3000)
    fetch_size = len(fetch_response(11, 0, script.fetch_records)) + 4  # the body and its header

    async def scenario() -> None:
        async with running(script, usage_log={"dir": str(tmp_path), "instance": "t"}) as h:
            a = await connect(h, "app-a")
            b = await connect(h, "app-b")
            p = produce(7, 2000)
            await a.call(p)
            await a.call(p)
            await a.call(fetch(11))
            await a.call(create_topics(5, [("x", 4, 0), ("y", 0, 2)]))
            await b.call(list_groups())
            await b.call(list_groups())
            a.close()
            b.close()
    run(scenario())
    recs = records(tmp_path)
    assert {r["instance"] for r in recs} == {"t"} and {r["interval_s"] for r in recs} == {10}
    a = totals(recs, "ANONYMOUS", "app-a")
    assert a["produce_bytes"] == 2 * (2000 + 4)  # the size a client-id of 5 letters gives, not 1
    assert a["fetch_bytes"] == fetch_size
    assert a["partitions_mutated"] == 6  # 4 + 2 assigned, counted with no quota configured
    assert a["connections"] == 1
    assert a["requests"] == {"produce": 2, "fetch": 1, "metadata": 0, "group": 0, "transaction": 0,
                             "admin": 1, "other": 0}
    assert a["throttle_ms"] == {t: 0 for t in a["throttle_ms"]}
    assert a["request_time_ms"] > 0
    assert a["quotas"] == {k: None for k in a["quotas"]}
    b = totals(recs, "ANONYMOUS", "app-b")
    assert b["requests"]["group"] == 2 and b["produce_bytes"] == 0 and b["connections"] == 1


def test_throttles_and_quotas_in_force_are_logged(tmp_path: Path) -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script, usage_log={"dir": str(tmp_path), "instance": "t"},
                           quotas=[{"client-id": "c", "producer_byte_rate": 500}]) as h:
            freeze(h)
            c = await connect(h)
            assert (await c.call(produce(7, 5040))).throttle_time_ms == 80
            c.close()
    run(scenario())
    c = totals(records(tmp_path), "ANONYMOUS", "c")
    assert c["produce_bytes"] == 5040
    assert c["throttle_ms"]["produce"] == 80 and c["throttled"]["produce"] == 1
    assert c["quotas"]["producer_byte_rate"] == 500.0
