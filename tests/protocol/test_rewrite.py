"""rewrite_addresses: every broker address replaced, every other byte left as it was."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import pytest
from kafka.protocol.admin.cluster import DescribeClusterResponse
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataResponse
from kafka.protocol.producer.produce import ProduceResponse

from kafka_quota_proxy.protocol.api_keys import DESCRIBE_CLUSTER, FETCH, FIND_COORDINATOR, METADATA, PRODUCE
from kafka_quota_proxy.protocol.errors import MalformedMessage, ProtocolError, TruncatedMessage
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.protocol.rewrite import carries_addresses, rewrite_addresses
from kafka_quota_proxy.protocol.walk import walker
from tests.support.encoding import compact_string, uvarint
from tests.support.future import encode_future, future

Address = tuple[str, int]


class RecordingMapper:
    """Maps node N to proxy-N.proxy.example.test:40000+N and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, int]] = []

    def __call__(self, node_id: int, host: str, port: int) -> Address:
        self.calls.append((node_id, host, port))
        return self.address(node_id)

    @staticmethod
    def address(node_id: int) -> Address:
        return f"proxy-{node_id}.proxy.example.test", 40000 + node_id


# Real broker addresses: host, port and rack per node id.
BROKERS = {1: ("kafka-1.internal", 9092, "rack-a"), 2: ("k2", 9093, None), 30: ("10.0.0.30", 19092, "r")}
MAPPED = {n: RecordingMapper.address(n) for n in BROKERS}
REAL = {n: (h, p) for n, (h, p, _) in BROKERS.items()}


def enc(msg: Any, version: int) -> bytes:
    return bytes(msg.encode(version=version))


def assert_no_real_address(body: bytes) -> None:
    for host, _port, _rack in BROKERS.values():
        assert host.encode() not in body


# --- Metadata ------------------------------------------------------------------------------------------

MB = MetadataResponse.MetadataResponseBroker
MT = MetadataResponse.MetadataResponseTopic
MP = MT.MetadataResponsePartition


def metadata(version: int, addresses: dict[int, Address]) -> MetadataResponse:
    brokers = [MB(node_id=n, host=addresses[n][0], port=addresses[n][1], rack=BROKERS[n][2]) for n in BROKERS]
    topics = [
        MT(error_code=0, name="orders", topic_id=uuid.UUID(int=0xABCDEF), is_internal=False,
           partitions=[MP(error_code=0, partition_index=i, leader_id=[1, 2, 30][i], leader_epoch=7 + i,
                          replica_nodes=[1, 2, 30], isr_nodes=[1, 30], offline_replicas=[2] if i else [])
                       for i in range(3)],
           authorized_operations={3, 4, 5}),
        MT(error_code=3, name="missing", topic_id=uuid.UUID(int=0), is_internal=False, partitions=[],
           authorized_operations={1}),
        MT(error_code=0, name="__consumer_offsets", topic_id=uuid.UUID(int=99), is_internal=True,
           partitions=[MP(error_code=0, partition_index=0, leader_id=2, leader_epoch=1, replica_nodes=[2],
                          isr_nodes=[2], offline_replicas=[])], authorized_operations={7}),
    ]
    return MetadataResponse(version=version, throttle_time_ms=250, brokers=brokers, cluster_id="cluster-XYZ",
                            controller_id=30, topics=topics, authorized_operations={2, 9}, error_code=0)


@pytest.mark.parametrize("version", [0, 1, 2, 8, 9, 10, 12, 13])
def test_metadata(version: int) -> None:
    original = enc(metadata(version, REAL), version)
    mapper = RecordingMapper()
    out = rewrite_addresses(METADATA, version, memoryview(original), mapper)
    assert out is not None
    # Exactly what kafka-python produces for the same message with proxy addresses.
    assert out == enc(metadata(version, MAPPED), version)
    assert mapper.calls == [(n, h, p) for n, (h, p, _) in BROKERS.items()]
    assert_no_real_address(out)

    decoded = MetadataResponse.decode(out, version=version)
    assert [(b.node_id, b.host, b.port) for b in decoded.brokers] == [(n, *MAPPED[n]) for n in BROKERS]
    if version >= 1:
        assert [b.rack for b in decoded.brokers] == [r for _, _, r in BROKERS.values()]
    before = MetadataResponse.decode(original, version=version).to_dict()
    after = decoded.to_dict()
    before.pop("brokers")
    after.pop("brokers")
    assert after == before

    # Byte for byte, only the broker array differs.
    flexible = version >= 9
    w = walker("MetadataResponse", version, flexible)
    a, b = w.walk(memoryview(original), 0), w.walk(memoryview(out), 0)
    after_brokers = "ClusterId" if version >= 2 else ("ControllerId" if version >= 1 else "Topics")
    assert original[: a.offsets["Brokers"]] == out[: b.offsets["Brokers"]]
    assert original[a.offsets[after_brokers] :] == out[b.offsets[after_brokers] :]


def test_metadata_v0_exact_bytes() -> None:
    body = (
        struct.pack(">i", 1) + struct.pack(">i", 7) + struct.pack(">h", 2) + b"b7" + struct.pack(">i", 9092)
        + struct.pack(">i", 1) + struct.pack(">h", 0) + struct.pack(">h", 1) + b"t"
        + struct.pack(">i", 0)
    )
    out = rewrite_addresses(METADATA, 0, memoryview(body), lambda n, h, p: ("p", 1))
    expected = (
        struct.pack(">i", 1) + struct.pack(">i", 7) + struct.pack(">h", 1) + b"p" + struct.pack(">i", 1)
        + body[4 + 4 + 2 + 2 + 4 :]
    )
    assert out == expected


def test_metadata_with_no_brokers_calls_nothing() -> None:
    msg = MetadataResponse(version=12, throttle_time_ms=0, brokers=[], cluster_id=None, controller_id=-1,
                           topics=[])
    original = enc(msg, 12)
    mapper = RecordingMapper()
    assert rewrite_addresses(METADATA, 12, memoryview(original), mapper) is None  # nothing to change
    assert mapper.calls == []


def test_identity_mapper_reproduces_the_body() -> None:
    for version in (0, 1, 9, 12, 13):
        original = enc(metadata(version, REAL), version)
        out = rewrite_addresses(METADATA, version, memoryview(original), lambda n, h, p: (h, p))
        assert out == original


def test_metadata_truncated_is_refused() -> None:
    original = enc(metadata(12, REAL), 12)
    with pytest.raises(TruncatedMessage):
        rewrite_addresses(METADATA, 12, memoryview(original[:20]), RecordingMapper())
    with pytest.raises(TruncatedMessage):
        rewrite_addresses(METADATA, 12, memoryview(b""), RecordingMapper())
    with pytest.raises(MalformedMessage):  # what the Metadata observer is given is decoded whole
        rewrite_addresses(METADATA, 12, memoryview(original[:-3]), RecordingMapper(), lambda _: None)


def test_metadata_unknown_top_level_tag_is_preserved() -> None:
    original = enc(metadata(12, REAL), 12)
    assert original[-1] == 0
    with_tag = original[:-1] + b"\x01\x1f\x03abc"  # tag 31, three bytes
    out = rewrite_addresses(METADATA, 12, memoryview(with_tag), RecordingMapper())
    assert out is not None
    assert out.endswith(b"\x01\x1f\x03abc")


def test_metadata_unknown_tag_in_a_broker_entry_is_preserved() -> None:
    cls = future(MetadataResponse)

    def msg(addresses: dict[int, Address]) -> Any:
        return cls(version=12, throttle_time_ms=0, cluster_id="c", controller_id=1, topics=[], brokers=[
            cls.MetadataResponseBroker(node_id=n, host=addresses[n][0], port=addresses[n][1], rack=None,
                                       **({"future200": b"xyz"} if n == 2 else {}))
            for n in (1, 2)], future63=b"top")

    original = encode_future(msg(REAL), 12)
    assert b"\x01\xc8\x01\x04\x04xyz" in original  # one tag: 200 (a two-byte varint), 4 bytes
    out = rewrite_addresses(METADATA, 12, memoryview(original), RecordingMapper())
    assert out == encode_future(msg(MAPPED), 12)
    assert out.endswith(b"\x01\x3f\x04\x04top")


# --- FindCoordinator -----------------------------------------------------------------------------------

Coordinator = FindCoordinatorResponse.Coordinator


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_single_node(version: int) -> None:
    def msg(host: str, port: int) -> FindCoordinatorResponse:
        return FindCoordinatorResponse(version=version, throttle_time_ms=12, error_code=0, error_message=None,
                                       node_id=2, host=host, port=port)

    original = enc(msg("k2", 9093), version)
    mapper = RecordingMapper()
    out = rewrite_addresses(FIND_COORDINATOR, version, memoryview(original), mapper)
    assert out == enc(msg(*MAPPED[2]), version)
    assert mapper.calls == [(2, "k2", 9093)]
    decoded = FindCoordinatorResponse.decode(out, version=version)
    assert (decoded.node_id, decoded.host, decoded.port) == (2, *MAPPED[2])
    if version >= 1:
        assert decoded.throttle_time_ms == 12
    assert_no_real_address(out)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_error_is_untouched(version: int) -> None:
    msg = FindCoordinatorResponse(version=version, throttle_time_ms=0, error_code=15,
                                  error_message="The coordinator is not available.", node_id=-1, host="",
                                  port=-1)
    original = enc(msg, version)
    mapper = RecordingMapper()
    assert rewrite_addresses(FIND_COORDINATOR, version, memoryview(original), mapper) is None
    assert mapper.calls == []


@pytest.mark.parametrize("version", [4, 5, 6])
def test_find_coordinator_batched(version: int) -> None:
    def msg(addresses: dict[int, Address]) -> FindCoordinatorResponse:
        return FindCoordinatorResponse(version=version, throttle_time_ms=3, coordinators=[
            Coordinator(key="group-a", node_id=1, host=addresses[1][0], port=addresses[1][1], error_code=0,
                        error_message=None),
            Coordinator(key="group-b", node_id=-1, host="", port=-1, error_code=15,
                        error_message="not available"),
            Coordinator(key="txn-\u00e9", node_id=30, host=addresses[30][0], port=addresses[30][1],
                        error_code=0, error_message=None),
        ])

    original = enc(msg(REAL), version)
    mapper = RecordingMapper()
    out = rewrite_addresses(FIND_COORDINATOR, version, memoryview(original), mapper)
    assert out == enc(msg(MAPPED), version)
    assert mapper.calls == [(1, "kafka-1.internal", 9092), (30, "10.0.0.30", 19092)]
    decoded = FindCoordinatorResponse.decode(out, version=version)
    assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in decoded.coordinators] == [
        ("group-a", 1, *MAPPED[1], 0),
        ("group-b", -1, "", -1, 15),
        ("txn-\u00e9", 30, *MAPPED[30], 0),
    ]
    assert decoded.coordinators[1].error_message == "not available"
    assert decoded.throttle_time_ms == 3
    assert_no_real_address(out)


@pytest.mark.parametrize("version", [4, 6])
def test_find_coordinator_batched_all_errors_untouched(version: int) -> None:
    msg = FindCoordinatorResponse(version=version, throttle_time_ms=0, coordinators=[
        Coordinator(key="g", node_id=-1, host="", port=-1, error_code=15, error_message=None)])
    original = enc(msg, version)
    mapper = RecordingMapper()
    assert rewrite_addresses(FIND_COORDINATOR, version, memoryview(original), mapper) is None
    assert mapper.calls == []


# --- DescribeCluster -----------------------------------------------------------------------------------

DCB = DescribeClusterResponse.DescribeClusterBroker


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_cluster(version: int) -> None:
    def msg(addresses: dict[int, Address]) -> DescribeClusterResponse:
        return DescribeClusterResponse(
            version=version, throttle_time_ms=1, error_code=0, error_message=None, endpoint_type=1,
            cluster_id="cluster-XYZ", controller_id=2,
            brokers=[DCB(broker_id=n, host=addresses[n][0], port=addresses[n][1], rack=BROKERS[n][2],
                         is_fenced=(n == 30)) for n in BROKERS],
            authorized_operations={1, 4, 31})

    original = enc(msg(REAL), version)
    mapper = RecordingMapper()
    out = rewrite_addresses(DESCRIBE_CLUSTER, version, memoryview(original), mapper)
    assert out == enc(msg(MAPPED), version)
    assert mapper.calls == [(n, h, p) for n, (h, p, _) in BROKERS.items()]
    decoded = DescribeClusterResponse.decode(out, version=version)
    assert [(b.broker_id, b.host, b.port, b.rack) for b in decoded.brokers] == [
        (n, *MAPPED[n], BROKERS[n][2]) for n in BROKERS
    ]
    if version >= 2:
        assert [b.is_fenced for b in decoded.brokers] == [False, False, True]
    assert decoded.cluster_id == "cluster-XYZ"
    assert decoded.controller_id == 2
    assert_no_real_address(out)
    w = walker("DescribeClusterResponse", version, True)
    a, b = w.walk(memoryview(original), 0), w.walk(memoryview(out), 0)
    assert original[: a.offsets["Brokers"]] == out[: b.offsets["Brokers"]]
    tail = "ClusterAuthorizedOperations"
    assert original[a.offsets[tail] :] == out[b.offsets[tail] :]


# --- KIP-951 node_endpoints in Produce and Fetch ---------------------------------------------------------

PT = ProduceResponse.TopicProduceResponse
PP = PT.PartitionProduceResponse
FT = FetchResponse.FetchableTopicResponse
FP = FT.PartitionData

ENDPOINT_IDS = [1, 30]


def node_endpoints_section(addresses: dict[int, Address]) -> bytes:
    value = uvarint(len(ENDPOINT_IDS) + 1) + b"".join(
        struct.pack(">i", n) + compact_string(addresses[n][0]) + struct.pack(">i", addresses[n][1])
        + compact_string(BROKERS[n][2]) + b"\x00"
        for n in ENDPOINT_IDS
    )
    return b"\x01\x00" + uvarint(len(value)) + value


def produce(version: int, addresses: dict[int, Address] | None) -> ProduceResponse:
    def topic(name: str) -> PT:
        ident = {"topic_id": uuid.uuid5(uuid.NAMESPACE_URL, name)} if version >= 13 else {"name": name}
        return PT(**ident, partition_responses=[
            PP(index=0, error_code=0, base_offset=100, log_append_time_ms=-1, log_start_offset=0,
               record_errors=[], error_message=None),
            PP(index=1, error_code=6, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
               record_errors=[PP.BatchIndexAndErrorMessage(batch_index=0, batch_index_error_message="x")],
               error_message="NOT_LEADER_OR_FOLLOWER",
               current_leader=PP.LeaderIdAndEpoch(leader_id=30, leader_epoch=4)),
        ])

    kw: dict[str, Any] = {}
    if addresses is not None:
        kw["node_endpoints"] = [ProduceResponse.NodeEndpoint(node_id=n, host=addresses[n][0],
                                                             port=addresses[n][1], rack=BROKERS[n][2])
                                for n in ENDPOINT_IDS]
    return ProduceResponse(version=version, throttle_time_ms=77, responses=[topic("a"), topic("b")], **kw)


RECORDS = [bytes(range(256)) * 3, b"", None, b"\x00" * 200]


def fetch(version: int, addresses: dict[int, Address] | None) -> FetchResponse:
    def topic(name: str) -> FT:
        ident = {"topic_id": uuid.uuid5(uuid.NAMESPACE_URL, name)} if version >= 13 else {"topic": name}
        return FT(**ident, partitions=[
            FP(partition_index=i, error_code=6 if i == 1 else 0, high_watermark=1000, last_stable_offset=900,
               log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=r,
               **({"current_leader": FP.LeaderIdAndEpoch(leader_id=1, leader_epoch=2)} if i == 1 else {}))
            for i, r in enumerate(RECORDS)
        ])

    kw: dict[str, Any] = {}
    if addresses is not None:
        kw["node_endpoints"] = [FetchResponse.NodeEndpoint(node_id=n, host=addresses[n][0],
                                                           port=addresses[n][1], rack=BROKERS[n][2])
                                for n in ENDPOINT_IDS]
    return FetchResponse(version=version, throttle_time_ms=0, error_code=0, session_id=55,
                         responses=[topic("events")], **kw)


NODE_ENDPOINT_CASES = [(PRODUCE, v, produce, ProduceResponse) for v in range(10, 14)] + [
    (FETCH, v, fetch, FetchResponse) for v in range(16, 19)
]


@pytest.mark.parametrize("api_key, version, build, cls", NODE_ENDPOINT_CASES,
                         ids=[f"{c[3].__name__}-v{c[1]}" for c in NODE_ENDPOINT_CASES])
def test_node_endpoints_rewritten(api_key: int, version: int, build: Any, cls: Any) -> None:
    original = enc(build(version, REAL), version)
    w = walker(cls.__name__, version, True)
    tags_at = w.walk(memoryview(original), 0).tags_at
    assert original[tags_at:] == node_endpoints_section(REAL)

    mapper = RecordingMapper()
    view = memoryview(original)
    spliced = rewrite_addresses(api_key, version, view, mapper)
    # Only the tagged section is new; the rest is a view of the original bytes, not a copy.
    assert isinstance(spliced, Pieces)
    keep = spliced.parts[0]
    assert isinstance(keep, memoryview) and keep.obj is original and len(keep) == tags_at
    assert len(spliced) == len(spliced.join())
    out = spliced.join()
    assert out == enc(build(version, MAPPED), version)
    assert mapper.calls == [(n, *REAL[n]) for n in ENDPOINT_IDS]
    assert_no_real_address(out)
    # Everything before the top-level tagged fields (records included) is byte-identical.
    assert out[:tags_at] == original[:tags_at]
    assert out[tags_at:] == node_endpoints_section(MAPPED)
    decoded = cls.decode(out, version=version)
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == [
        (n, *MAPPED[n], BROKERS[n][2]) for n in ENDPOINT_IDS
    ]
    if cls is FetchResponse:
        assert [p.records for p in decoded.responses[0].partitions] == RECORDS


@pytest.mark.parametrize("api_key, version, build, cls", NODE_ENDPOINT_CASES,
                         ids=[f"{c[3].__name__}-v{c[1]}" for c in NODE_ENDPOINT_CASES])
def test_without_node_endpoints_nothing_is_rewritten(api_key: int, version: int, build: Any,
                                                     cls: Any) -> None:
    original = enc(build(version, None), version)
    assert original[-1] == 0  # empty top-level tagged fields
    view = memoryview(original)
    mapper = RecordingMapper()
    assert rewrite_addresses(api_key, version, view, mapper) is None
    assert mapper.calls == []
    assert bytes(view) == original


@pytest.mark.parametrize("api_key, version, build, cls", NODE_ENDPOINT_CASES[:1] + NODE_ENDPOINT_CASES[-1:])
def test_node_endpoints_check_rejects_truncated_and_trailing_bytes(api_key: int, version: int, build: Any,
                                                                   cls: Any) -> None:
    original = enc(build(version, REAL), version)
    for cut in (0, 1, len(original) // 2, len(original) - 1):
        with pytest.raises(TruncatedMessage):
            rewrite_addresses(api_key, version, memoryview(original[:cut]), RecordingMapper())
    with pytest.raises(MalformedMessage):
        rewrite_addresses(api_key, version, memoryview(original + b"\x00"), RecordingMapper())


def test_other_top_level_tags_without_node_endpoints_return_none() -> None:
    original = enc(fetch(16, None), 16)
    with_tag = original[:-1] + b"\x01\x05\x02hi"  # an unknown tag 5, no tag 0
    mapper = RecordingMapper()
    assert rewrite_addresses(FETCH, 16, memoryview(with_tag), mapper) is None
    assert mapper.calls == []


@pytest.mark.parametrize("api_key, version",
                         [(PRODUCE, 9), (PRODUCE, 3), (FETCH, 15), (FETCH, 4), (2, 11), (18, 4)])
def test_versions_without_addresses_are_not_read(api_key: int, version: int) -> None:
    mapper = RecordingMapper()
    assert rewrite_addresses(api_key, version, memoryview(b"not a valid body"), mapper) is None
    assert mapper.calls == []


def test_carries_addresses() -> None:
    for v in range(14):
        assert carries_addresses(METADATA, v)
    for v in range(7):
        assert carries_addresses(FIND_COORDINATOR, v)
    for v in range(3):
        assert carries_addresses(DESCRIBE_CLUSTER, v)
    assert [v for v in range(14) if carries_addresses(PRODUCE, v)] == [10, 11, 12, 13]
    assert [v for v in range(19) if carries_addresses(FETCH, v)] == [16, 17, 18]
    for key in (2, 8, 9, 11, 18, 19, 32, 75):
        assert not carries_addresses(key, 0)
        assert not carries_addresses(key, 20)


def test_errors_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        rewrite_addresses(DESCRIBE_CLUSTER, 0, memoryview(b"\x00"), RecordingMapper())


@pytest.mark.parametrize("api_key, version, build, cls", NODE_ENDPOINT_CASES,
                         ids=[f"{c[3].__name__}-v{c[1]}" for c in NODE_ENDPOINT_CASES])
def test_empty_node_endpoints_need_no_rewrite(api_key: int, version: int, build: Any, cls: Any) -> None:
    # Tansu sends node_endpoints on every Produce/Fetch response, mostly empty.
    without = enc(build(version, None), version)
    assert without[-1:] == b"\x00"
    original = without[:-1] + b"\x01\x00\x01\x01"  # one tag: 0, one byte: an empty array
    assert cls.decode(original, version=version).node_endpoints == []
    mapper = RecordingMapper()
    assert rewrite_addresses(api_key, version, memoryview(original), mapper) is None
    assert mapper.calls == []
