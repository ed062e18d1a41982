"""A quota kind registered in quota/kinds.py and nothing else (issue 38's toy kind): a cap on a
client's ListGroups requests per second, end to end in-process against a scripted broker on the
fake clock: configured in the quota file, enforced with Kafka's throttle, set and described
through the admin API, metered, and logged in the usage log."""

from __future__ import annotations

from pathlib import Path

from kafka_quota_proxy.quota.kinds import registered
from tests.proxy.conftest import running
from tests.proxy.quota_support import (
    START_MS,
    Script,
    alter,
    alter_results,
    connect,
    describe,
    entries,
    freeze,
    kafka_throttle,
    list_groups,
    metric,
    run,
    scope,
)
from tests.support.kinds import LIST_GROUPS_RATE
from tests.support.usage import usage_records

# The one registry line (tests/support/kinds.py): the kind's key, its throttles' quota_type,
# Kafka's INT value type, an extension, the requests it counts, and the usage log's counter.


def test_a_registered_request_rate_kind_is_configured_enforced_described_metered_and_logged(
        tmp_path: Path) -> None:
    script = Script()

    async def scenario() -> None:
        with registered(LIST_GROUPS_RATE):
            async with running(script, quotas=[{"client-id": "c", "list_groups_request_rate": 2}],
                               usage_log={"dir": str(tmp_path), "instance": "t"}) as h:
                freeze(h)
                c = await connect(h)
                # Kafka's Rate on a new sensor spans (11 - 1) windows of 1 s, so 20 ListGroups
                # at one instant are 2/s, within the quota; the 21st is 2.1/s, throttled by
                # Kafka's rule: (2.1 - 2) / 2 x 10 s.
                for _ in range(20):
                    assert (await c.call(list_groups())).throttle_time_ms == 0
                assert (await c.call(list_groups())).throttle_time_ms == kafka_throttle(2.1, 2) == 500
                manager = h.proxy.engine.scope(scope(h)).rates[LIST_GROUPS_RATE.key]
                assert manager.measure("ANONYMOUS", "c", START_MS) == 2.1
                assert metric(h, "kafka_quota_proxy_throttled_requests_total", quota_type="list_groups",
                              user="ANONYMOUS", client_id="c") == 1
                assert metric(h, "kafka_quota_proxy_throttle_time_ms_total", quota_type="list_groups",
                              user="ANONYMOUS", client_id="c") == 500
                # the rate on its sensor, tagged as Kafka tags it: a client-id quota's has no user
                entity = {"quota_type": "list_groups_request_rate", "scope": scope(h), "user": "",
                          "client_id": "c"}
                assert metric(h, "kafka_quota_proxy_request_rate", **entity) == 2.1
                assert metric(h, "kafka_quota_proxy_quota_limit", **entity) == 2.0
                c.close()
                # the admin API, on a connection of a client-id without the quota
                admin = await connect(h, client_id="admin")
                described = await admin.call(describe([("client-id", 0, "c")]))
                assert entries(described) == {(("client-id", "c"),): {"list_groups_request_rate": 2.0}}
                changed = await admin.call(alter([([("client-id", "c")],
                                                   [("list_groups_request_rate", 30.0, False)])]))
                assert alter_results(changed) == [(0, None)]
                described = await admin.call(describe([("client-id", 0, "c")]))
                assert entries(described) == {(("client-id", "c"),): {"list_groups_request_rate": 30.0}}
                admin.close()
    run(scenario())
    # the usage log, written at shutdown (the run may straddle an interval's end: summed): the
    # kind's throttle and its quota in force beside the built-in kinds'
    mine = [r for r in usage_records(tmp_path, "t") if r["client_id"] == "c"]
    throttled = {t: sum(r["throttled"][t] for r in mine) for t in mine[0]["throttled"]}
    assert throttled == {"produce": 0, "fetch": 0, "request": 0, "controller_mutation": 0,
                         "producer_ids": 0, "list_groups": 1}
    assert sum(r["throttle_ms"]["list_groups"] for r in mine) == 500
    assert sum(r["requests"]["group"] for r in mine) == 21
    assert sum(r["list_groups_requests"] for r in mine) == 21  # the kind's own counter
    # the admin connection's requests are its own tenant's: none of them ListGroups
    admin = [r for r in usage_records(tmp_path, "t") if r["client_id"] == "admin"]
    assert admin and all(r["list_groups_requests"] == 0 for r in admin)
    assert mine[-1]["quotas"]["list_groups_request_rate"] == 30.0
