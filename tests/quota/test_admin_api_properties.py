"""Properties of DescribeClientQuotas and AlterClientQuotas as the proxy answers them (the stage in
proxy/stages/client_quotas_api.py over quota/admin_api.py): any request kafka-python can encode is
decoded exactly and answered with a response that decodes, field for field, as what was decided;
damaged or arbitrary bodies are refused only with ProtocolError, never anything else."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from kafka_quota_proxy.config.quota_settings import parse_quota_section
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.quota_runtime.access import QuotaAccess
from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.client_quotas_api import SERVED, ClientQuotasApi
from kafka_quota_proxy.quota.admin_api import alter_client_quotas, describe_client_quotas
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import BUILT_IN_KEYS
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.support.messages import message
from tests.support.mutations import mutated

QUOTAS = {
    QuotaEntity(user="alice"): {QuotaKey.PRODUCER_BYTE_RATE: 1024.0},
    QuotaEntity(user="<default>", client_id="c1"): {QuotaKey.CONSUMER_BYTE_RATE: 2048.0},
    QuotaEntity(ip="10.0.0.1"): {QuotaKey.CONNECTION_CREATION_RATE: 5.0},
    QuotaEntity(client_id="<default>"): {QuotaKey.REQUEST_PERCENTAGE: 12.5},
}
MAX_VERSION = {48: SERVED[0][2], 49: SERVED[1][2]}
REQUESTS = {48: DescribeClientQuotasRequest, 49: AlterClientQuotasRequest}
RESPONSES = {48: DescribeClientQuotasResponse, 49: AlterClientQuotasResponse}


def stage() -> ClientQuotasApi:
    """Open to every principal: who may is tests/proxy/quota_runtime/test_quota_access.py's business."""
    store = QuotaStore()
    engine = QuotaEngine(parse_quota_section({"alter_principals": ["*"]}), store)
    return ClientQuotasApi(QuotaControl(store, QUOTAS, None), engine, QuotaAccess(authenticated=False))


def context(frame: bytes) -> RequestContext:
    view = memoryview(frame)
    return RequestContext(parse_request_header(view), view, ConnectionInfo("10.0.0.9:5000", "bootstrap"))


# Entity types and keys near the real ones, so that most requests get past the first check.
ENTITY_TYPES = st.sampled_from(["user", "client-id", "ip", "", "topic"]) | st.text(max_size=4)
NAMES = st.none() | st.sampled_from(["alice", "c1", "10.0.0.1", "<default>", "", "::1"]) | st.text(max_size=6)
KEYS = st.sampled_from([k.value for k in BUILT_IN_KEYS] + ["bogus"])
VALUES = st.floats(allow_nan=False) | st.sampled_from([0.0, -1.0, 1.5, 2.0**63, 1e300])


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, int, Any]:
    key = draw(st.sampled_from([48, 49]))
    version = draw(st.integers(0, MAX_VERSION[key]))
    msg = draw(message(REQUESTS[key], version))
    # Fill the wire-level strings from the near-real sets above (the schema's random text would
    # almost never name an entity type).
    if key == 48:
        for c in msg.components:
            c.entity_type, c.match_type, c.match = draw(ENTITY_TYPES), draw(st.integers(-1, 3)), draw(NAMES)
    else:
        for entry in msg.entries:
            for e in entry.entity:
                e.entity_type, e.entity_name = draw(ENTITY_TYPES), draw(NAMES)
            for op in entry.ops:
                op.key, op.value = draw(KEYS), draw(VALUES)
    return key, version, msg


@given(requests())
def test_decoded_exactly_and_answered_as_decided(case: tuple[int, int, Any]) -> None:
    key, version, msg = case
    frame = frame_request(msg, version, 5, "admin")
    ctx = context(frame)
    decoded = ctx.decode_request()
    assert decoded == REQUESTS[key].decode(bytes(msg.encode(version=version)), version=version)
    reply = stage().on_request(ctx)
    assert reply is not None and reply.body is not None
    answer = RESPONSES[key].decode(reply.body, version=version)
    if key == 48:
        components = [(c.entity_type, c.match_type, c.match) for c in decoded.components]
        result = describe_client_quotas(QUOTAS, components, decoded.strict)
        assert (answer.error_code, answer.error_message) == (result.error_code, result.error_message)
        got = None if answer.entries is None else [
            ([(e.entity_type, e.entity_name) for e in entry.entity], {v.key: v.value for v in entry.values})
            for entry in answer.entries]
        assert got == result.entries
    else:
        wire = [([(e.entity_type, e.entity_name) for e in entry.entity],
                 [(op.key, op.value, op.remove) for op in entry.ops]) for entry in decoded.entries]
        results = alter_client_quotas(QUOTAS, wire, decoded.validate_only).results
        assert [(e.error_code, e.error_message) for e in answer.entries] == results
        entities = [[(x.entity_type, x.entity_name) for x in e.entity] for e in answer.entries]
        assert entities == [w[0] for w in wire]


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    key, version, msg = draw(requests())
    frame = frame_request(msg, version, 5, "admin")
    at = parse_request_header(memoryview(frame)).body_offset
    return frame[:at] + draw(mutated(frame[at:]) | st.binary(max_size=60))


NULL_COMPONENTS = (  # DescribeClientQuotas v1 with components null (compact length 0)
    b"\x00\x00\x00\x13\x000\x00\x01\x00\x00\x00\x05\x00\x05admin\x00\x00\x00\x00")
NULL_OPS = (  # AlterClientQuotas v0, one entry with no entity and ops null (length -1)
    b"\x00\x00\x00\x1c\x001\x00\x00\x00\x00\x00\x05\x00\x05admin"
    b"\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff\x00")


@given(damaged())
@example(NULL_COMPONENTS)  # leaked TypeError from the stage iterating None
@example(NULL_OPS)
def test_damaged_requests_refused_only_with_protocol_errors(frame: bytes) -> None:
    ctx = context(frame)
    try:
        reply = stage().on_request(ctx)
    except ProtocolError:
        return
    assert reply is not None and reply.body is not None
