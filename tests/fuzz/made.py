"""Seed inputs made from Kafka's message JSON, for the APIs no client of the recording sends
through Tansu (tests/fuzz/record.py): KIP-932 share groups, KIP-848 consumer groups, KIP-1071
streams groups and DescribeQuorum, which a proxy in front of Apache Kafka 4 carries, and more
versions of the responses the proxy splices into than the recorded clients asked for.

Each message is filled from its schema (kafka-python's classes, the vendored JSON for the APIs it
lacks, protocol/apis.py) by a seeded random source, so the seeds are the same on every run: every
field present at the version (tagged ones every other time), arrays of zero to two elements,
record fields holding real record batches, the values a broker or client would send as often as
edge values. `python -m tests.fuzz.record --made` writes them, with the inputs the new targets
take from the recorded corpus, without recording anything.
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Iterator
from functools import cache
from typing import Any

from kafka.protocol.schemas.fields.codecs import (
    UUID,
    BitField,
    Boolean,
    Bytes,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    UnsignedInt16,
)
from kafka.record.memory_records import MemoryRecordsBuilder

from kafka_quota_proxy.protocol.api_keys import (
    API_VERSIONS,
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    DESCRIBE_CONFIGS,
    DESCRIBE_QUORUM,
    INCREMENTAL_ALTER_CONFIGS,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_DESCRIBE,
    SHARE_GROUP_HEARTBEAT,
    STREAMS_GROUP_DESCRIBE,
    STREAMS_GROUP_HEARTBEAT,
)
from kafka_quota_proxy.protocol.apis import codec
from kafka_quota_proxy.protocol.rewrite import carries_addresses
from kafka_quota_proxy.protocol.throttle import carries_throttle

# The Kafka 4 client APIs a recording through Tansu never sees.
KAFKA4_APIS = (DESCRIBE_QUORUM, CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE, SHARE_GROUP_HEARTBEAT,
               SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE, STREAMS_GROUP_HEARTBEAT,
               STREAMS_GROUP_DESCRIBE)
# The responses a stage changes by splicing into the broker's bytes (the `splice` target).
SPLICED = (API_VERSIONS, PRODUCE, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS)
SEEDS_PER_VERSION = 2
SEEDS_OF = {SHARE_FETCH: 5}  # the share_fetch targets' only seeds: 10, where a target wants 8
_INTS = {Int8: 8, Int16: 16, Int32: 32, Int64: 64}
_TEXT = ("", "g", "member-1", "broker-1.internal", "orders", "producer_byte_rate", "é")
PREFIX = struct.Struct(">hh")  # the response targets' api_key, api_version (tests/fuzz/targets.py)


@cache
def _batch(records: int) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(records):
        builder.append(timestamp=1_700_000_000_000 + i, key=None, value=b"v" * (40 + 30 * i), headers=[])
    builder.close()
    return bytes(builder.buffer())


def _simple(field: Any, rng: random.Random, nullable: bool) -> Any:
    codec_type = field._type
    if nullable and rng.random() < 0.2:
        return None
    if codec_type in _INTS:
        bits = _INTS[codec_type]
        return rng.choice([0, 1, 3, 42, -1, 2 ** (bits - 1) - 1])
    if codec_type is UnsignedInt16:
        return rng.choice([0, 1, 9092, 65535])
    if codec_type is Boolean:
        return rng.random() < 0.5
    if codec_type is Float64:
        return rng.choice([0.0, 1.5, -2.25])
    if codec_type is UUID:
        return uuid.UUID(int=rng.getrandbits(128))
    if codec_type is BitField:
        return {1, 3}
    if isinstance(codec_type, String):
        return rng.choice(_TEXT)
    if codec_type is Bytes:
        if field.type_str == "records":
            return _batch(rng.randint(1, 3))
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 12)))
    raise AssertionError(f"no value for {field.type_str}")


def _struct(cls: Any, struct_: Any, version: int, rng: random.Random, top: bool = False) -> Any:
    values: dict[str, Any] = {}
    for f in struct_.fields.values():
        if not f.for_version_q(version) or (f.tagged_field_q(version) and rng.random() < 0.5):
            continue
        nullable = f.nullable_for_version_q(version)
        if f.is_struct_array() or f.is_array():
            if nullable and rng.random() < 0.15:
                values[f.name] = None
                continue
            n = rng.randint(0, 2)
            if f.is_struct_array():
                values[f.name] = [_struct(f.data_class, f, version, rng) for _ in range(n)]
            else:  # an array's elements are never null in Kafka
                values[f.name] = [_simple(f.array_of, rng, False) for _ in range(n)]
        elif f.is_struct():
            null = nullable and rng.random() < 0.2
            values[f.name] = None if null else _struct(f.data_class, f, version, rng)
        else:
            values[f.name] = _simple(f, rng, nullable)
    return cls(version=version, **values) if top else cls(**values)


def filled(cls: Any, version: int, seed: int) -> Any:
    """A message of `cls` at `version`, every field filled from `seed`."""
    return _struct(cls, cls._struct, version, random.Random(f"{cls.__name__}-{version}-{seed}"), top=True)


def versions(cls: Any) -> range:
    """The versions Kafka's JSON declares valid ("1-2", "0+" is not used by messages)."""
    low, _, high = str(cls._json["validVersions"]).partition("-")
    return range(int(low), int(high or low) + 1)


def request_frame(msg: Any, version: int, correlation_id: int) -> bytes:
    msg.with_header(correlation_id=correlation_id, client_id="made")
    return bytes(msg.encode(version=version, header=True, framed=True))


def response_input(api_key: int, msg: Any, version: int, correlation_id: int) -> bytes:
    """A response as the response targets take it: api_key, api_version, then the frame."""
    body = bytes(msg.encode(version=version))
    flexible = codec()[api_key].response_header_version(version) == 1
    header = struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"")
    return PREFIX.pack(api_key, version) + struct.pack(">i", len(header) + len(body)) + header + body


def inputs() -> Iterator[tuple[str, bytes, object]]:
    """(target, input, kind) of every made seed; `kind` as tests/fuzz/record.py caps them."""
    correlation_id = 1000
    for api_key in (*KAFKA4_APIS, *SPLICED):
        spec = codec()[api_key]
        for version in versions(spec.response):
            for seed in range(SEEDS_OF.get(api_key, SEEDS_PER_VERSION)):
                correlation_id += 1
                kind = ("made", api_key, version, seed)
                response = response_input(api_key, filled(spec.response, version, seed), version,
                                          correlation_id)
                if api_key in SPLICED:
                    yield "splice", response, kind
                    continue
                request = request_frame(filled(spec.request, version, seed), version, correlation_id)
                yield "request_header", request, kind
                yield "well_formed", request, kind
                if carries_throttle(api_key, version):
                    yield "throttle", response, kind
                if carries_addresses(api_key, version):
                    yield "rewrite", response, kind
                if api_key == SHARE_FETCH:
                    yield "share_fetch", request, kind
                    yield "share_fetch_response", response, kind
