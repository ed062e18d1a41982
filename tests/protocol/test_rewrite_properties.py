"""Properties of broker address rewriting, at every version of every response that carries an
address: each broker address is replaced by the mapper's, every other field is as the broker
sent it (and in Produce/Fetch every byte before the tagged fields is the broker's own, not a
copy), and unknown tagged fields anywhere in the body pass byte for byte; damaged or arbitrary
bodies raise only ProtocolError."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from kafka_quota_proxy.protocol.api_keys import DESCRIBE_CLUSTER, FETCH, FIND_COORDINATOR, METADATA, PRODUCE
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.rewrite import rewrite_addresses, rewrite_node_endpoints_tag
from kafka_quota_proxy.protocol.walk import walker
from tests.support.future import encode_future, future
from tests.support.messages import message
from tests.support.mutations import mutated


def mapped(node_id: int, host: str, port: int) -> tuple[str, int]:
    """The proxy's address for a broker: a function of all three, so a mix-up would show."""
    return f"proxy-{node_id}.{len(host)}.example", 40000 + port % 20000


def decoded_nodes(api_key: int, version: int, msg: Any) -> list[Any]:
    """The address-carrying structs of a decoded response (FindCoordinator v0-3: the message)."""
    if api_key == FIND_COORDINATOR:
        return list(msg.coordinators or ()) if version >= 4 else [msg]
    if api_key in (METADATA, DESCRIBE_CLUSTER):
        return list(msg.brokers or ())
    return list(msg.node_endpoints or ())


def node_id(api_key: int, node: Any) -> int:
    return int(node.broker_id if api_key == DESCRIBE_CLUSTER else node.node_id)


DECODED_KEYS = [METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER]
ADDRESSED = ([(k, v) for k in DECODED_KEYS for v in range(codec()[k].max_version + 1)]
             + [(PRODUCE, v) for v in range(10, codec()[PRODUCE].max_version + 1)]
             + [(FETCH, v) for v in range(16, codec()[FETCH].max_version + 1)])
responses = st.sampled_from(ADDRESSED).flatmap(
    lambda api: message(codec()[api[0]].response, api[1]).map(lambda m: (api[0], api[1], m)))


@given(responses)
def test_every_address_rewritten_and_nothing_else(case: tuple[int, int, Any]) -> None:
    api_key, version, msg = case
    cls = codec()[api_key].response
    body = bytes(msg.encode(version=version))
    seen: list[Any] = []
    out = rewrite_addresses(api_key, version, memoryview(body), mapped, seen.append)
    expected = cls.decode(body, version=version)  # what the broker said, as kafka-python reads it
    for node in decoded_nodes(api_key, version, expected):
        # Errors (FindCoordinator's -1/""/-1) carry no address; node_endpoints has no errors.
        if api_key in (PRODUCE, FETCH) or (node_id(api_key, node) >= 0 and node.port >= 0):
            node.host, node.port = mapped(node_id(api_key, node), node.host, node.port)
    assert len(seen) == (1 if api_key == METADATA else 0)  # the observer sees each Metadata once
    if api_key in (PRODUCE, FETCH):
        if not msg.node_endpoints or "node_endpoints" not in (msg.tags or ()):
            assert out is None
            return
        assert isinstance(out, Pieces)
        tags_at = walker(cls.name, version, True).walk(memoryview(body), 0).tags_at
        head = out.parts[0]
        assert isinstance(head, memoryview) and head.obj is not None and bytes(head) == body[:tags_at]
        new = out.join()
    else:
        assert out is None or isinstance(out, bytes)
        new = body if out is None else out
    assert cls.decode(new, version=version) == expected


@given(st.sampled_from(ADDRESSED).flatmap(
    lambda api: message(future(codec()[api[0]].response), api[1]).map(lambda m: (api[0], api[1], m))))
def test_unknown_tagged_fields_survive_byte_for_byte(case: tuple[int, int, Any]) -> None:
    """A newer broker's tagged fields, in every struct, are kept: the output is the input with
    only the addresses changed, as kafka-python writes the same message with the new addresses."""
    api_key, version, msg = case
    body = encode_future(msg, version)
    out = rewrite_addresses(api_key, version, memoryview(body), mapped, lambda _: None)
    for node in decoded_nodes(api_key, version, msg):
        if api_key in (PRODUCE, FETCH) or (node_id(api_key, node) >= 0 and node.port >= 0):
            node.host, node.port = mapped(node_id(api_key, node), node.host, node.port)
    new = body if out is None else out.join() if isinstance(out, Pieces) else out
    assert new == encode_future(msg, version)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[int, int, bytes]:
    api_key, version, msg = draw(responses)
    return api_key, version, draw(mutated(bytes(msg.encode(version=version))))


def rewrite(api_key: int, version: int, body: bytes) -> None:
    try:
        out = rewrite_addresses(api_key, version, memoryview(body), mapped)
    except ProtocolError:
        return
    if isinstance(out, Pieces):
        out.join()


NON_UTF8_HOST = (  # Produce v10 response, empty but for node_endpoints [(1, b"\xff", 9092, null)]
    PRODUCE, 10, b"\x01\x00\x00\x00\x00\x01\x00\x0d\x02\x00\x00\x00\x01\x02\xff\x00\x00\x23\x84\x00\x00")


NULL_HOST = (  # FindCoordinator v0: error 0, node 0, host null (length -1), port 0
    FIND_COORDINATOR, 0, b"\x00\x00\x00\x00\x00\x00\xff\xff\x00\x00\x00\x00")


@given(damaged())
@example(NON_UTF8_HOST)  # leaked UnicodeDecodeError from the host of a node_endpoints entry
@example(NULL_HOST)  # handed the mapper a None host, kept by the proxy as the broker address
def test_damaged_bodies_raise_only_protocol_errors(case: tuple[int, int, bytes]) -> None:
    rewrite(*case)


@given(st.sampled_from(ADDRESSED), st.binary(max_size=80))
def test_arbitrary_bodies_raise_only_protocol_errors(api: tuple[int, int], body: bytes) -> None:
    rewrite(*api, body)


@given(st.binary(max_size=80))
@example(b"\x02\x00\x00\x00\x01\x02\xff\x00\x00\x23\x84\x00\x00")  # a host that is not UTF-8
def test_arbitrary_node_endpoints_raise_only_protocol_errors(value: bytes) -> None:
    try:
        rewrite_node_endpoints_tag(memoryview(value), mapped)
    except ProtocolError:
        pass
