"""Properties of IncrementalAlterConfigs and DescribeConfigs as the proxy splits them (the stages in
proxy/stages/topic_configs.py over quota/topic_configs.py): whatever the request, every resource is
either answered by the proxy or forwarded, in order, never both; no forwarded TOPIC resource
carries a quota key; a request without one is forwarded as it came; damaged bodies are refused
only with ProtocolError."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.admin.configs import (
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from kafka_quota_proxy.config.quota_settings import parse_quota_section
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.access import QuotaAccess
from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.topic_configs import TopicConfigsAlter, TopicConfigsDescribe
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaStore
from kafka_quota_proxy.quota.topic_configs import QUOTA_CONFIGS, TOPIC_RESOURCE, AlterPlan
from tests.support.messages import message
from tests.support.mutations import mutated

QUOTAS = {QuotaEntity(topic="orders"): {QuotaKey.PRODUCER_BYTE_RATE: 1024.0}}


def parts() -> tuple[QuotaControl, QuotaEngine, QuotaAccess]:
    store = QuotaStore()
    engine = QuotaEngine(parse_quota_section({"alter_principals": ["*"]}), store)
    return QuotaControl(store, QUOTAS, None), engine, QuotaAccess(authenticated=False)


def context(frame: bytes) -> RequestContext:
    view = memoryview(frame)
    return RequestContext(parse_request_header(view), view, ConnectionInfo("10.0.0.9:5000", "bootstrap"))


NAMES = st.sampled_from(["orders", "other", "", "<default>", "1"]) | st.text(max_size=6)
CONFIGS = st.sampled_from([*sorted(QUOTA_CONFIGS), "retention.ms", "cleanup.policy"])
VALUES = (st.none() | st.sampled_from(["1048576", "0", "-1", "1.5", " 7 ", "x", str(2**63)])
          | st.text(max_size=5))


@st.composite
def alters(draw: st.DrawFn) -> tuple[int, Any]:
    version = draw(st.integers(0, 1))
    msg = draw(message(IncrementalAlterConfigsRequest, version))
    for r in msg.resources:
        r.resource_type, r.resource_name = draw(st.sampled_from([TOPIC_RESOURCE, 4, 8])), draw(NAMES)
        for c in r.configs:
            c.name, c.config_operation, c.value = draw(CONFIGS), draw(st.integers(-1, 4)), draw(VALUES)
    return version, msg


@given(alters())
def test_every_resource_is_answered_once_and_no_quota_key_reaches_the_broker(case: tuple[int, Any]) -> None:
    version, msg = case
    frame = frame_request(msg, version, 5, "admin")
    ctx = context(frame)
    request = ctx.decode_request()
    names = [(r.resource_type, r.resource_name) for r in request.resources]
    reply = TopicConfigsAlter(*parts()).on_request(ctx)
    if reply is not None:  # every resource answered here
        assert reply.body is not None
        answer = IncrementalAlterConfigsResponse.decode(reply.body, version=version)
        assert [(r.resource_type, r.resource_name) for r in answer.responses] == names
        return
    if ctx.replaced is None:  # untouched: no TOPIC resource with a quota key
        assert not any(r.resource_type == TOPIC_RESOURCE and any(c.name in QUOTA_CONFIGS for c in r.configs)
                       for r in request.resources)
        return
    plan = ctx.topics.configs if ctx.topics is not None else None
    assert isinstance(plan, AlterPlan) and plan.resources == names
    joined = ctx.replaced.join()
    assert int.from_bytes(joined[:4], "big") == len(joined) - 4
    forwarded = context(joined).decode_request()
    assert forwarded.validate_only == request.validate_only
    assert [(r.resource_type, r.resource_name) for r in forwarded.resources] == [
        name for name, answer in zip(names, plan.answers, strict=True) if answer is None]
    for r in forwarded.resources:
        assert r.resource_type != TOPIC_RESOURCE or not any(c.name in QUOTA_CONFIGS for c in r.configs)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        version, msg = draw(alters())
    else:
        version = draw(st.integers(0, 4))
        msg = draw(message(DescribeConfigsRequest, version))
        for r in msg.resources:
            r.resource_type, r.resource_name = TOPIC_RESOURCE, draw(NAMES)
    frame = frame_request(msg, version, 5, "admin")
    at = parse_request_header(memoryview(frame)).body_offset
    return frame[:at] + draw(mutated(frame[at:]) | st.binary(max_size=60))


@given(damaged())
def test_damaged_requests_refused_only_with_protocol_errors(frame: bytes) -> None:
    ctx = context(frame)
    stage = TopicConfigsAlter(*parts()) if ctx.api_key == 44 else TopicConfigsDescribe(*parts())
    try:
        stage.on_request(ctx)
    except ProtocolError:
        return
