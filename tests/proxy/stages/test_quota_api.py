"""DescribeClientQuotas and AlterClientQuotas answered by the proxy, over the wire."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from tests.proxy.conftest import (
    is_closed,
    request_frame,
    running,
)
from tests.proxy.quota_support import (
    MUTATION_QUOTA,
    PRODUCE_QUOTA,
    Script,
    alter,
    alter_results,
    api_versions,
    broker_frames,
    connect,
    describe,
    entries,
    freeze,
    kafka_throttle,
    produce,
    run,
)

# --- DescribeClientQuotas / AlterClientQuotas ---------------------------------------------------

def test_quota_apis_over_the_wire() -> None:
    script = Script()

    async def scenario() -> None:
        async with running(script) as h:
            freeze(h)
            c = await connect(h)
            versions = await c.call(api_versions())
            listed = {(a.api_key, a.min_version, a.max_version) for a in versions.api_keys}
            assert {(48, 0, 1), (49, 0, 1)} <= listed  # the fake broker lists neither

            # No quota yet: not throttled.
            assert (await c.call(produce(7, 5040))).throttle_time_ms == 0

            # kafka-configs --alter --entity-type clients --entity-name c --add-config ...
            result = await c.call(alter([([("client-id", "c")], [("producer_byte_rate", 500.0, False)])]))
            assert alter_results(result) == [(0, None)]
            # ... --entity-type clients --entity-default
            result = await c.call(alter([([("client-id", None)], [("consumer_byte_rate", 2000.0, False)])],
                                        version=0))
            assert alter_results(result) == [(0, None)]

            exact = await c.call(describe([("client-id", 0, "c")]))
            assert entries(exact) == {(("client-id", "c"),): {"producer_byte_rate": 500.0}}
            default = await c.call(describe([("client-id", 1, None)], version=0))
            assert entries(default) == {(("client-id", None),): {"consumer_byte_rate": 2000.0}}
            specified = await c.call(describe([("client-id", 2, None)]))
            assert entries(specified) == {(("client-id", "c"),): {"producer_byte_rate": 500.0},
                                          (("client-id", None),): {"consumer_byte_rate": 2000.0}}
            assert entries(await c.call(describe([("user", 2, None)]))) == {}

            # In force for the next request. The earlier 5040 B were not recorded (no
            # producer_byte_rate had ever been set), so this is a fresh window.
            assert (await c.call(produce(7, 5040))).throttle_time_ms == kafka_throttle(504, 500) == 80

            # Removing it lifts the throttle.
            result = await c.call(alter([([("client-id", "c")], [("producer_byte_rate", 0.0, True)])]))
            assert alter_results(result) == [(0, None)]
            assert (await c.call(produce(7, 50_000))).throttle_time_ms == 0

            # A user and client-id entity, described as kafka-configs --entity-type users
            # --entity-name alice --entity-type clients [--entity-default] sends it.
            result = await c.call(alter([
                ([("user", "alice"), ("client-id", None)], [("request_percentage", 25.0, False)]),
                ([("user", "alice")], [("producer_byte_rate", 1e6, False)])]))
            assert alter_results(result) == [(0, None), (0, None)]
            both = await c.call(describe([("user", 0, "alice"), ("client-id", 1, None)]))
            assert entries(both) == {(("user", "alice"), ("client-id", None)): {"request_percentage": 25.0}}
            any_client = await c.call(describe([("user", 0, "alice"), ("client-id", 2, None)]))
            assert entries(any_client) == entries(both)
            assert entries(await c.call(describe([("user", 0, "alice")]))) == {
                (("user", "alice"),): {"producer_byte_rate": 1e6}}

            # Kafka's validation, and a bad filter.
            result = await c.call(alter([([("client-id", "c")], [("producer_byte_rate", 10.5, False)]),
                                         ([("user", "")], [("producer_byte_rate", 10.0, False)])]))
            assert [code for code, _ in alter_results(result)] == [42, 42]
            bad = await c.call(describe([("other", 2, None)]))
            assert (bad.error_code, bad.entries) == (35, None)
            assert script.api_keys.count(48) == 0 and script.api_keys.count(49) == 0
            c.close()
    run(scenario())


def test_validate_only_changes_nothing() -> None:
    async def scenario() -> None:
        async with running() as h:
            c = await connect(h)
            result = await c.call(alter([([("user", "alice")], [("request_percentage", 25.0, False)])],
                                        validate_only=True))
            assert alter_results(result) == [(0, None)]
            assert h.proxy.quotas.entries() == {}
            c.close()
    run(scenario())


def test_alter_principals_refuses_everyone_else() -> None:
    async def scenario() -> None:
        async with running(quota={"alter_principals": ["admin"]},
                           quotas=PRODUCE_QUOTA) as h:
            c = await connect(h)
            request = alter([([("client-id", "c")], [("producer_byte_rate", 9e9, False)]),
                             ([("user", None)], [("consumer_byte_rate", 1.0, False)])])
            result = await c.call(request)
            # ANONYMOUS from loopback may only until alter_principals names who may.
            assert alter_results(result) == [(31, "Principal ANONYMOUS may not alter client quotas: it "
                                                  "is not in quota.alter_principals")] * 2
            assert [[(e.entity_type, e.entity_name) for e in entry.entity] for entry in result.entries] == [
                [("client-id", "c")], [("user", None)]]
            assert h.proxy.quotas.entries() == {QuotaEntity(client_id="c"): {
                QuotaKey.PRODUCER_BYTE_RATE: 500.0}}
            c.close()
    run(scenario())


@pytest.mark.parametrize(("api_key", "version", "name"), [
    (19, 6, "CreateTopics"), (20, 5, "DeleteTopics"), (37, 3, "CreatePartitions"),
    (48, 1, "DescribeClientQuotas"), (49, 0, "AlterClientQuotas")])
def test_a_body_whose_lengths_do_not_fit_closes_that_connection(api_key: int, version: int, name: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    # Refused by the WellFormed stage before a stage decodes it: its first count (0x02056162 or
    # a compact 1) runs past the 4 bytes there are.
    async def scenario() -> None:
        async with running(quotas=MUTATION_QUOTA) as h:
            c = await connect(h)
            c.writer.write(request_frame(api_key, version, 1, b"\x02\x05abc", client_id=b"c",
                                         flexible=codec()[api_key].is_flexible(version)))
            assert await is_closed(c.reader)
            assert h.errors("truncated") == 1
            assert broker_frames(h) == []
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert f"(ANONYMOUS, bootstrap): truncated: {name} v{version}: " in warning


def test_a_body_that_does_not_decode_closes_that_connection(caplog: pytest.LogCaptureFixture) -> None:
    # Every length true, but the topic name is not UTF-8: the stages' decode refuses it.
    body = struct.pack(">ih", 1, 1) + b"\xff" + struct.pack(">ihiiib", 1, 1, 0, 0, 0, 0)
    async def scenario() -> None:
        async with running(quotas=MUTATION_QUOTA) as h:
            c = await connect(h)
            c.writer.write(request_frame(19, 4, 1, body, client_id=b"c"))
            assert await is_closed(c.reader)
            assert h.errors("malformed") == 1
            assert broker_frames(h) == []
    with caplog.at_level("WARNING", logger="kafka_quota_proxy"):
        run(scenario())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    assert "(ANONYMOUS, bootstrap): malformed: cannot decode CreateTopicsRequest v4: " in warning


# --- Found by the whole-proxy fuzz (make fuzz-proxy) --------------------------------------------

def test_a_quota_value_that_is_not_a_number_is_refused_and_audited(caplog: pytest.LogCaptureFixture) -> None:
    # A fuzzed AlterClientQuotas asked for NaN: refused as Kafka refuses it, but the audit line
    # formatting the value asked for raised ValueError (int(nan)) out of the stage: a traceback
    # in the log, "Task exception was never retrieved". inf raised OverflowError the same way.
    async def scenario() -> None:
        async with running(Script()) as h:
            c = await connect(h)
            for value in (float("nan"), float("inf"), float("-inf")):
                result = await c.call(alter([([("client-id", "c")], [("producer_byte_rate", value, False)])]))
                assert [code for code, _ in alter_results(result)] == [42]
            c.close()
    with caplog.at_level("INFO", logger="kafka_quota_proxy"):
        run(scenario())
    assert "Traceback" not in caplog.text
    audit = [r.getMessage() for r in caplog.records if r.name == "kafka_quota_proxy.audit"]
    assert [line.split(" new=")[1].split(" ")[0] for line in audit] == ["nan", "inf", "-inf"]


# --- Found by the coverage-guided fuzzer (make fuzz) --------------------------------------------

# crash-9894e27b24cf68b7614f4a2c2d01efe89a6d2d8b (client_quotas target): AlterClientQuotas v1
# with a null `entries` array, which kafka-python decodes as None. The stage iterated over it:
# a TypeError out of data_received, a traceback in the log, and no protocol error counted.
NULL_ENTRIES = bytes.fromhex(
    "000000540031000100000001000d6b61666b612d00280030000100000001000d"
    "6b61666b612d636f6e6669677300020575640461707000021372657175656f62"
    "000a636c69656e7461676540490000000000000000000000")


@pytest.mark.parametrize("frame", [
    NULL_ENTRIES,
    request_frame(48, 0, 5, b"\xff\xff\xff\xff\x00", client_id=b"kafka-configs"),  # null components
], ids=["alter-null-entries", "describe-null-components"])
def test_a_null_quota_array_is_a_protocol_error(frame: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(Script()) as h:
            reader, writer = await h.connect()
            writer.write(frame)
            assert await is_closed(reader)
            assert h.errors("malformed") == 1
            writer.close()

    run(scenario())
    assert "Traceback" not in caplog.text and "null" in caplog.text


def test_quotas_adopted_from_a_shared_store_are_in_force_even_when_the_state_file_cannot_be_written(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from kafka_quota_proxy.config.quota_state import change_field
    from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
    from kafka_quota_proxy.quota.resolution import QuotaStore

    store = QuotaStore()
    unwritable = tmp_path / "missing-dir" / "state.json"
    control = QuotaControl(store, {}, unwritable)
    field, value = change_field(QuotaEntity(user="alice"), QuotaKey.PRODUCER_BYTE_RATE, 4096.0)
    with caplog.at_level(logging.ERROR, logger="kafka_quota_proxy"):
        assert control.adopt_shared({field: value}) == []
    assert store.get(QuotaEntity(user="alice")) == {QuotaKey.PRODUCER_BYTE_RATE: 4096.0}
    assert "not saved locally" in caplog.text
