"""Request frames that more than one test sends, each with where it came from."""

from __future__ import annotations

# The request that killed Tansu in the whole-proxy fuzz (docs/reliability.md, isolated with
# tests.fuzz.isolate): CreateTopics v7 from a mutated kafka-python session, one topic
# 'fuzz-04a110-3.0.' with num_partitions 825,360,385 (0x31320001: bytes of the recorded topic
# name) and replication_factor 256, Assignments and Configs null, validate_only true.
FUZZ_CREATE_TOPICS = bytes.fromhex(
    "0000003f001300070000000300136b61666b612d707974686f6e2d332e302e313200021166757a7a2d30346131"
    "31302d332e302e313200010100000000210010000500")

# librdkafka's Metadata v12 for all topics (recorded, tests/fuzz/corpus/request_header): the
# null topics array in 4 bytes where its varint takes 1 (confluentinc/librdkafka#5049), so the
# body ends 3 bytes early. Kafka answers it.
LIBRDKAFKA_METADATA = bytes.fromhex("000000190003000c00000004000772646b61666b610000000000010000")
