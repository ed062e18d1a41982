"""Topic quotas through kafka-configs.sh --entity-type topics, in-process against a scripted broker:
the exact requests the tool sends (DescribeConfigs of the topic, then IncrementalAlterConfigs with
its DELETE and SET ops), and the exact bytes the proxy answers with."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin.configs import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from kafka_quota_proxy.config.quota_state import change_field
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import MalformedMessage
from kafka_quota_proxy.protocol.headers import RequestHeader, frame_response
from kafka_quota_proxy.protocol.messages import decode_response
from kafka_quota_proxy.proxy.stages.topic_configs import broker_results, described
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.topic_configs import DOCUMENTATION, DescribeAdditions
from tests.proxy.conftest import Harness, running
from tests.proxy.quota_support import Client, Script, broker_frames, connect, metric, run
from tests.support.fake_broker import BrokerConn

TOPIC, BROKER = 2, 4  # ConfigResource types
SET, DELETE, APPEND = 0, 1, 2
P, C = "producer_byte_rate", "consumer_byte_rate"
ORDERS = QuotaEntity(topic="orders")

Resource = tuple[int, str, list[tuple[str, int, str | None]]]
Result = tuple[int, str, int, str | None]


class ConfigScript(Script):
    """A broker keeping topic configs: IncrementalAlterConfigs applies SET and DELETE (answering
    each resource, in reverse order, with `refuse`'s error for that name if any), DescribeConfigs
    answers every topic it has with its configs (DYNAMIC_TOPIC_CONFIG) and any other with
    UNKNOWN_TOPIC_OR_PARTITION."""

    def __init__(self) -> None:
        super().__init__()
        self.configs: dict[str, dict[str, str]] = {"orders": {"retention.ms": "604800000"}, "other": {}}
        self.refuse: dict[str, tuple[int, str]] = {}
        self.omit: set[str] = set()  # resources left out of the answer
        self.altered: list[Any] = []  # each IncrementalAlterConfigs the broker saw, decoded

    async def __call__(self, conn: BrokerConn, header: RequestHeader, frame: bytes) -> bytes | None:
        key, v = header.api_key, header.api_version
        if key == 44:
            request: Any = IncrementalAlterConfigsRequest.decode(frame[header.body_offset:], version=v)
            self.altered.append(request)
            results: list[Result] = []
            for r in request.resources:
                code, message = self.refuse.get(r.resource_name, (0, None))
                if not code and not request.validate_only and r.resource_type == TOPIC:
                    for c in r.configs:
                        if c.config_operation == SET:
                            self.configs.setdefault(r.resource_name, {})[c.name] = c.value
                        else:
                            self.configs.setdefault(r.resource_name, {}).pop(c.name, None)
                results.append((r.resource_type, r.resource_name, code, message))
            return alter_body(v, 5, [r for r in results[::-1] if r[1] not in self.omit])
        if key == 32:
            request = DescribeConfigsRequest.decode(frame[header.body_offset:], version=v)
            return describe_body(v, [
                (r.resource_name, 0 if r.resource_name in self.configs else 3,
                 sorted((name, value) for name, value in self.configs.get(r.resource_name, {}).items()
                        if not r.configuration_keys or name in r.configuration_keys), [])
                for r in request.resources], synonyms=v >= 1 and request.include_synonyms)
        return await super().__call__(conn, header, frame)


def alter(resources: list[Resource], validate_only: bool = False, version: int = 1) -> Any:
    cls: Any = IncrementalAlterConfigsRequest
    r = cls.AlterConfigsResource
    return cls(version=version, validate_only=validate_only, resources=[
        r(resource_type=kind, resource_name=name,
          configs=[r.AlterableConfig(name=n, config_operation=op, value=value) for n, op, value in configs])
        for kind, name, configs in resources])


def alter_body(version: int, throttle_ms: int, results: list[Result]) -> bytes:
    cls: Any = IncrementalAlterConfigsResponse
    return bytes(cls(version=version, throttle_time_ms=throttle_ms, responses=[
        cls.AlterConfigsResourceResponse(error_code=code, error_message=message, resource_type=kind,
                                         resource_name=name)
        for kind, name, code, message in results]).encode(version=version))


def describe(names: list[str], keys: list[str] | None = None, version: int = 4,
             synonyms: bool = False, documentation: bool = False) -> Any:
    cls: Any = DescribeConfigsRequest
    return cls(version=version, include_synonyms=synonyms, include_documentation=documentation,
               resources=[cls.DescribeConfigsResource(resource_type=TOPIC, resource_name=name,
                                                      configuration_keys=keys) for name in names])


Entry = tuple[str, str]


def describe_body(version: int, results: list[tuple[str, int, list[Entry], list[Entry]]],
                  synonyms: bool = False, documentation: bool = False) -> bytes:
    """A DescribeConfigs response: per topic, its error code, the broker's entries and then the
    proxy's (both DYNAMIC_TOPIC_CONFIG; the proxy's are LONG, with their documentation)."""
    cls: Any = DescribeConfigsResponse.DescribeConfigsResult
    entry = cls.DescribeConfigsResourceResult

    def config(name: str, value: str, ours: bool) -> Any:
        synonym = entry.DescribeConfigsSynonym(name=name, value=value, source=1)
        return entry(name=name, value=value, read_only=False, is_default=False, is_sensitive=False,
                     config_source=1, synonyms=[synonym] if synonyms else [],
                     config_type=5 if ours else 2,
                     documentation=DOCUMENTATION[name] if ours and documentation else None)
    return bytes(DescribeConfigsResponse(version=version, throttle_time_ms=0, results=[
        cls(error_code=code, error_message="Topic does not exist" if code else None, resource_type=TOPIC,
            resource_name=name, configs=[config(n, value, False) for n, value in broker] +
                                        [config(n, value, True) for n, value in ours])
        for name, code, broker, ours in results]).encode(version=version))


async def exchange(c: Client, msg: Any) -> tuple[bytes, int]:
    """Send `msg`; its raw response and correlation id."""
    corr = await c.send(msg)
    raw, _ = await c.recv(msg)
    return raw, corr


def framed(msg: Any, corr: int, body: bytes) -> bytes:
    return frame_response(corr, codec()[msg.API_KEY].response_header_version(msg.API_VERSION), body)


def quotas(h: Harness) -> dict[QuotaEntity, dict[QuotaKey, float]]:
    return h.proxy.quotas.entries()


def test_kafka_configs_sets_describes_and_deletes_a_topic_quota(tmp_path: Path) -> None:
    script = ConfigScript()
    state = tmp_path / "state.json"

    async def scenario() -> None:
        async with running(script, quota={"state_file": str(state)}) as h:
            c = await connect(h)
            retention = [("retention.ms", "604800000")]
            # kafka-configs.sh --alter: the topic's configs first (nothing of the proxy's yet).
            msg = describe(["orders"], version=4)
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, describe_body(4, [("orders", 0, retention, [])]))
            # ... then --add-config producer_byte_rate=1048576: answered by the proxy alone.
            msg = alter([(TOPIC, "orders", [(P, SET, "1048576")])])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(1, 0, [(TOPIC, "orders", 0, None)]))
            assert script.altered == []
            assert quotas(h) == {ORDERS: {QuotaKey.PRODUCER_BYTE_RATE: 1048576.0}}
            # Kept as AlterClientQuotas keeps it, and queued for a shared store the same way.
            assert json.loads(state.read_text())["entities"] == [
                {"entity": {"topic": "orders"}, "values": {P: 1048576.0}, "removed": []}]
            assert h.proxy.quota_control.take_unshared() == [
                change_field(ORDERS, QuotaKey.PRODUCER_BYTE_RATE, 1048576.0)]
            # --describe --entity-type topics --entity-name orders (synonyms asked for).
            msg = describe(["orders"], version=4, synonyms=True)
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, describe_body(4, [("orders", 0, retention, [(P, "1048576")])],
                                                          synonyms=True))
            # --delete-config producer_byte_rate: the describe lists it, so the tool goes on.
            msg = alter([(TOPIC, "orders", [(P, DELETE, "")])], version=0)
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(0, 0, [(TOPIC, "orders", 0, None)]))
            assert quotas(h) == {}
            assert json.loads(state.read_text())["entities"] == [
                {"entity": {"topic": "orders"}, "values": {}, "removed": [P]}]
            msg = describe(["orders"], version=4)
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, describe_body(4, [("orders", 0, retention, [])]))
            assert script.altered == []
            assert metric(h, "kafka_quota_proxy_quota_changes_total", source="api", outcome="accepted") == 2
            c.close()
    run(scenario())


@pytest.mark.parametrize("version", [0, 1])
def test_other_configs_go_to_the_broker_and_the_answers_merge_in_request_order(version: int) -> None:
    script = ConfigScript()

    async def scenario() -> None:
        async with running(script) as h:
            c = await connect(h)
            msg = alter([(TOPIC, "orders", [(C, DELETE, None), (P, SET, "2048"),
                                            ("retention.ms", SET, "1000")]),
                         (BROKER, "1", [("log.cleaner.threads", SET, "2")]),
                         (TOPIC, "other", [(C, SET, "4096")]),
                         (TOPIC, "other2", [("cleanup.policy", SET, "compact")])], version=version)
            raw, corr = await exchange(c, msg)
            # The broker answered in its own order, throttle 5 ms; the proxy's result for "other" is
            # in its place.
            assert raw == framed(msg, corr, alter_body(version, 5, [
                (TOPIC, "orders", 0, None), (BROKER, "1", 0, None), (TOPIC, "other", 0, None),
                (TOPIC, "other2", 0, None)]))
            (seen,) = script.altered
            assert [(r.resource_type, r.resource_name,
                     [(x.name, x.config_operation, x.value) for x in r.configs])
                    for r in seen.resources] == [
                (TOPIC, "orders", [("retention.ms", SET, "1000")]),
                (BROKER, "1", [("log.cleaner.threads", SET, "2")]),
                (TOPIC, "other2", [("cleanup.policy", SET, "compact")])]
            assert seen.validate_only is False
            assert script.configs["orders"] == {"retention.ms": "1000"}
            assert quotas(h) == {ORDERS: {QuotaKey.PRODUCER_BYTE_RATE: 2048.0},
                                 QuotaEntity(topic="other"): {QuotaKey.CONSUMER_BYTE_RATE: 4096.0}}
            c.close()
    run(scenario())


def test_a_resource_the_broker_refuses_keeps_its_quota_as_it_was() -> None:
    script = ConfigScript()
    script.refuse["orders"] = (40, "Invalid value x for configuration retention.ms: "
                                   "Not a number of type LONG")

    async def scenario() -> None:
        async with running(script) as h:
            c = await connect(h)
            msg = alter([(TOPIC, "orders", [(P, SET, "2048"), ("retention.ms", SET, "x")])])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(1, 5, [(TOPIC, "orders", *script.refuse["orders"])]))
            assert quotas(h) == {}
            assert metric(h, "kafka_quota_proxy_quota_changes_total", source="api", outcome="refused") == 1
            c.close()
    run(scenario())


def test_a_resource_the_broker_leaves_out_of_its_answer_changes_no_quota() -> None:
    script = ConfigScript()
    script.omit.add("orders")

    async def scenario() -> None:
        async with running(script) as h:
            c = await connect(h)
            msg = alter([(TOPIC, "orders", [(P, SET, "2048"), ("retention.ms", SET, "1")]),
                         (TOPIC, "other", [(P, SET, "4096")])])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(1, 5, [(TOPIC, "other", 0, None)]))
            assert quotas(h) == {QuotaEntity(topic="other"): {QuotaKey.PRODUCER_BYTE_RATE: 4096.0}}
            c.close()
    run(scenario())


def test_a_bad_quota_op_fails_its_whole_resource_at_the_proxy() -> None:
    script = ConfigScript()

    async def scenario() -> None:
        async with running(script) as h:
            c = await connect(h)
            msg = alter([(TOPIC, "orders", [(P, SET, "1.5"), ("retention.ms", SET, "1000")]),
                         (TOPIC, "other", [(C, APPEND, "1")]),
                         (TOPIC, "other2", [("retention.ms", SET, "1")])])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(1, 5, [
                (TOPIC, "orders", 40, "Invalid value 1.5 for configuration producer_byte_rate: "
                                      "Not a number of type LONG"),
                (TOPIC, "other", 40, "Can't APPEND to key consumer_byte_rate because its type is not LIST."),
                (TOPIC, "other2", 0, None)]))
            (seen,) = script.altered  # the refused resources never reached it
            assert [r.resource_name for r in seen.resources] == ["other2"]
            assert script.configs["orders"] == {"retention.ms": "604800000"}
            # Quota ops alone, refused: answered without the broker.
            msg = alter([(TOPIC, "orders", [(P, SET, "0")])], version=0)
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(0, 0, [
                (TOPIC, "orders", 40, "Quota producer_byte_rate must be greater than 0")]))
            # A resource named twice is refused each time, as a broker does, and neither goes on.
            msg = alter([(TOPIC, "orders", [(P, SET, "1")]), (TOPIC, "orders", [("retention.ms", SET, "1")])])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(1, 0, [
                (TOPIC, "orders", 42, "Each resource must appear at most once.")] * 2))
            assert len(script.altered) == 1 and quotas(h) == {}
            c.close()
    run(scenario())


def test_validate_only_changes_nothing_at_the_proxy_or_the_broker() -> None:
    script = ConfigScript()

    async def scenario() -> None:
        async with running(script) as h:
            c = await connect(h)
            msg = alter([(TOPIC, "orders", [(P, SET, "2048")]),
                         (TOPIC, "other", [(C, SET, "4096"), ("retention.ms", SET, "1")])],
                        validate_only=True)
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(1, 5, [(TOPIC, "orders", 0, None),
                                                              (TOPIC, "other", 0, None)]))
            (seen,) = script.altered
            assert seen.validate_only is True and [r.resource_name for r in seen.resources] == ["other"]
            assert quotas(h) == {} and script.configs["other"] == {}
            assert metric(h, "kafka_quota_proxy_quota_changes_total", source="api", outcome="validated") == 2
            c.close()
    run(scenario())


def test_a_principal_that_may_not_alter_quotas_gets_alter_client_quotas_refusal(
        caplog: pytest.LogCaptureFixture) -> None:
    script = ConfigScript()
    reason = "Principal ANONYMOUS may not alter client quotas: it is not in quota.alter_principals"

    async def scenario() -> None:
        async with running(script, quota={"alter_principals": ["admin"]},
                           quotas=[{"topic": "orders", "producer_byte_rate": 1000}]) as h:
            c = await connect(h)
            # A tenant lifting its topic's quota, hidden beside a real config: refused whole.
            msg = alter([(TOPIC, "orders", [(P, SET, "999999999"), ("retention.ms", SET, "1")]),
                         (TOPIC, "other", [("retention.ms", SET, "1")])])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, alter_body(1, 5, [(TOPIC, "orders", 31, reason),
                                                              (TOPIC, "other", 0, None)]))
            (seen,) = script.altered
            assert [r.resource_name for r in seen.resources] == ["other"]
            assert quotas(h) == {ORDERS: {QuotaKey.PRODUCER_BYTE_RATE: 1000.0}}
            # Nor may it read the quota: the broker's answer goes back as it was.
            msg = describe(["orders"])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, describe_body(4, [
                ("orders", 0, [("retention.ms", "604800000")], [])]))
            c.close()
    with caplog.at_level(logging.INFO, logger="kafka_quota_proxy.audit"):
        run(scenario())
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kafka_quota_proxy.audit"]
    assert line.startswith("quota change refused: source=api principal=ANONYMOUS address=127.0.0.1:")
    assert line.endswith(f" entity=[topic=orders] key=producer_byte_rate old=1000 new=999999999 "
                         f"reason={reason!r}")


def test_a_request_without_quota_keys_passes_byte_for_byte() -> None:
    script = ConfigScript()

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": "orders", "producer_byte_rate": 1000}]) as h:
            c = await connect(h)
            msg = alter([(TOPIC, "orders", [("retention.ms", SET, "1000")]), (BROKER, "1", [(P, SET, "1")])])
            sent = c.frame(msg)
            c.writer.write(sent)
            raw, _ = await c.recv(msg)
            # A broker resource's producer_byte_rate is the broker's own business.
            assert broker_frames(h)[-1][4:] == sent[4:] and len(broker_frames(h)[-1]) == len(sent)
            assert raw == framed(msg, c.correlation, alter_body(1, 5, [(BROKER, "1", 0, None),
                                                                       (TOPIC, "orders", 0, None)]))
            # A DescribeConfigs of a topic without a quota: untouched.
            msg = describe(["other"])
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, describe_body(4, [("other", 0, [], [])]))
            c.close()
    run(scenario())


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_describe_configs_gains_the_topics_own_quota_keys(version: int) -> None:
    script = ConfigScript()
    script.configs["orders"][P] = "1"  # a stale one at the broker: the proxy's replaces it

    async def scenario() -> None:
        async with running(script, quotas=[{"topic": "orders", "producer_byte_rate": 1048576,
                                            "consumer_byte_rate": 5e7},
                                           {"topic": "<default>", "producer_byte_rate": 10}]) as h:
            c = await connect(h)
            msg = describe(["orders", "other", "gone"], version=version, synonyms=True, documentation=True)
            raw, corr = await exchange(c, msg)
            # "other" has only the <default> topic quota, which is not its own; "gone" failed.
            assert raw == framed(msg, corr, describe_body(version, [
                ("orders", 0, [("retention.ms", "604800000")], [(C, "50000000"), (P, "1048576")]),
                ("other", 0, [], []), ("gone", 3, [], [])],
                synonyms=version >= 1, documentation=version >= 3))
            # Keys named: only those (the broker filters its own).
            msg = describe(["orders"], keys=[C, "retention.ms"], version=version)
            raw, corr = await exchange(c, msg)
            assert raw == framed(msg, corr, describe_body(version, [
                ("orders", 0, [("retention.ms", "604800000")], [(C, "50000000")])]))
            c.close()
    run(scenario())


@pytest.mark.parametrize("api", ["describe", "alter"])
def test_a_brokers_null_results_array_is_a_protocol_error_not_a_crash(api: str) -> None:
    """Found by the `splice` fuzz target: kafka-python reads a null array where the schema has
    none (length -1) as None, which the stage then iterated (TypeError). Kafka's parser refuses
    such an answer; so does the stage, with the protocol error the data path handles."""
    throttle, null = b"\x00\x00\x00\x00", b"\xff\xff\xff\xff"
    with pytest.raises(MalformedMessage, match="null"):
        if api == "describe":  # DescribeConfigs v1: throttle_time_ms, results
            body = memoryview(throttle + null)
            described(body, 1, decode_response(32, 1, body), DescribeAdditions({}, False, False))
        else:  # IncrementalAlterConfigs v0: throttle_time_ms, responses
            broker_results(decode_response(44, 0, memoryview(throttle + null)))
