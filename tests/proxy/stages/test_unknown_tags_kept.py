"""The stages that change a broker's answer (topic configs, refused Produce topics) or a client's
request (an IncrementalAlterConfigs with topic quota ops taken out) keep every byte they do not
change: for messages drawn from a schema with tagged fields the proxy does not know, in every
struct, the output is what kafka-python writes for the same message with the stage's change made
to it, so each unknown tag is where the broker or the client put it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.admin.configs import (
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.producer.produce import ProduceResponse

from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.proxy.stages.topic_configs import described, merged_response, trimmed_request
from kafka_quota_proxy.proxy.stages.topic_quotas import appended
from kafka_quota_proxy.quota.topic_configs import DOCUMENTATION, DYNAMIC_TOPIC_CONFIG, LONG, DescribeAdditions
from tests.support.future import encode_future, future
from tests.support.messages import message

TOPIC = 2
P, C = "producer_byte_rate", "consumer_byte_rate"


def drawn(cls: Any, versions: range) -> st.SearchStrategy[tuple[int, Any]]:
    return st.sampled_from(versions).flatmap(lambda v: message(future(cls), v).map(lambda m: (v, m)))


@given(drawn(DescribeConfigsResponse, range(codec()[32].max_version + 1)), st.data())
def test_describe_configs_keeps_unknown_tags(case: tuple[int, Any], data: st.DataObject) -> None:
    version, msg = case
    results = list(msg.results or ())
    ours = data.draw(st.sets(st.sampled_from(range(len(results))))) if results else set()
    entries = {}
    for i in ours:  # a topic described without error, with the proxy's quota keys to add
        results[i].resource_type, results[i].error_code = TOPIC, 0
        entries[results[i].resource_name] = data.draw(st.lists(
            st.sampled_from([(P, "1048576"), (C, "7")]), min_size=1, max_size=2, unique_by=lambda e: e[0]))
    synonyms, documentation = data.draw(st.booleans()), data.draw(st.booleans())
    plan = DescribeAdditions(entries, synonyms=synonyms, documentation=documentation)
    body = encode_future(msg, version)
    out = described(memoryview(body), version, DescribeConfigsResponse.decode(body, version=version), plan)

    entry = DescribeConfigsResponse.DescribeConfigsResult.DescribeConfigsResourceResult
    changed = False
    for result in results:
        found = entries.get(result.resource_name)
        if result.resource_type != TOPIC or result.error_code or found is None:
            continue
        names = {n for n, _ in found}
        result.configs = [c for c in result.configs or [] if c.name not in names] + [entry(
            name=n, value=v, read_only=False, is_default=False, is_sensitive=False,
            config_source=DYNAMIC_TOPIC_CONFIG, config_type=LONG,
            synonyms=[entry.DescribeConfigsSynonym(name=n, value=v, source=DYNAMIC_TOPIC_CONFIG)]
            if plan.synonyms else [], documentation=DOCUMENTATION[n] if plan.documentation else None)
            for n, v in found]
        changed = True
    assert (out is not None) == changed
    assert (body if out is None else out) == encode_future(msg, version)


@given(drawn(IncrementalAlterConfigsResponse, range(codec()[44].max_version + 1)), st.data())
def test_incremental_alter_configs_keeps_unknown_tags(case: tuple[int, Any], data: st.DataObject) -> None:
    version, msg = case
    body = encode_future(msg, version)
    decoded = IncrementalAlterConfigsResponse.decode(body, version=version)
    broker = [(r.resource_type, r.resource_name, r.error_code, r.error_message) for r in decoded.responses]
    # The proxy's results are mixed in among the broker's, in any order, as merge_answers does.
    ours = data.draw(st.lists(st.tuples(st.just(TOPIC), st.text(max_size=5), st.integers(0, 90),
                                        st.none() | st.text(max_size=5)), max_size=3))
    merged = data.draw(st.permutations(broker + ours))
    out = merged_response(memoryview(body), version, broker, merged)

    cls = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
    by_identity = {id(b): r for b, r in zip(broker, msg.responses, strict=True)}
    msg.responses = [by_identity[id(m)] if id(m) in by_identity else
                     cls(resource_type=m[0], resource_name=m[1], error_code=m[2], error_message=m[3])
                     for m in merged]
    assert out == encode_future(msg, version)


@given(drawn(IncrementalAlterConfigsRequest, range(codec()[44].max_version + 1)), st.data())
def test_a_trimmed_incremental_alter_configs_request_keeps_unknown_tags(case: tuple[int, Any],
                                                                        data: st.DataObject) -> None:
    version, msg = case
    resources = list(msg.resources or ())
    for r in resources:  # some configs are quota keys, which the proxy takes out
        for c in r.configs or ():
            if data.draw(st.booleans()):
                c.name = data.draw(st.sampled_from([P, C]))
    body = encode_future(msg, version)
    wire = IncrementalAlterConfigsRequest.decode(body, version=version).resources
    forwarded = sorted(data.draw(st.sets(st.sampled_from(range(len(resources))))) if resources else set())
    trimmed = {i for i in forwarded if resources[i].configs is not None and data.draw(st.booleans())}
    out = trimmed_request(memoryview(body), version, wire, forwarded, trimmed)

    for i in trimmed:
        resources[i].configs = [c for c in resources[i].configs if c.name not in (P, C)]
    msg.resources = [resources[i] for i in forwarded]
    assert out == encode_future(msg, version)


@given(drawn(ProduceResponse, range(codec()[0].max_version + 1)), st.lists(st.text(max_size=5), max_size=3))
def test_refused_produce_topics_keep_unknown_tags(case: tuple[int, Any], names: list[str]) -> None:
    version, msg = case
    body = encode_future(msg, version)
    topic = ProduceResponse.TopicProduceResponse
    part = topic.PartitionProduceResponse
    added = [topic(name=n, partition_responses=[
        part(index=i, error_code=19, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
             record_errors=[], error_message="x") for i in range(2)]) for n in names]
    out = appended(memoryview(body), version, added)
    assert isinstance(out, Pieces)
    msg.responses = list(msg.responses or ()) + added
    assert out.join() == encode_future(msg, version)
