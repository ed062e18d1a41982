"""Kafka's limit on the partitions one CreateTopics request may create: 10,000 (KAFKA-17870,
Kafka 4.0). A request over it fails whole, every topic with POLICY_VIOLATION, before anything
is created; the proxy answers it so, and the broker never sees it.

Why the proxy holds to it: Tansu 0.6.0 has no such limit, accepts a topic of a billion
partitions (with validate_only too), and at the next Metadata request that lists the topic
allocates 96 bytes per partition at once and aborts ("memory allocation of 79234596960 bytes
failed"), taking every client of the proxy with it. The whole-proxy fuzz found this
(docs/reliability.md, "Whole-proxy fuzz").
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin.topics import CreateTopicsResponse

from kafka_quota_proxy.protocol.api_keys import CREATE_TOPICS
from kafka_quota_proxy.protocol.error_codes import POLICY_VIOLATION
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.proxy.stages.controller_mutations import DEFAULT_NUM_PARTITIONS

MAX_PARTITIONS_PER_REQUEST = 10_000  # Kafka's MAX_PARTITIONS_PER_BATCH
TOO_MANY_PARTITIONS = "Excessively large number of partitions per request."  # Kafka's words


def partitions_requested(request: Any) -> int:
    """The partitions a decoded CreateTopics request asks for, counted as Kafka counts them
    (ReplicationControlManager.validateTotalNumberOfPartitions): a topic's assignments if it has
    any, else its num_partitions, the broker's default for -1, nothing for 0 or below."""
    total = 0
    for topic in request.topics:
        if topic.assignments:
            total += len(topic.assignments)
        elif topic.num_partitions == -1:
            total += DEFAULT_NUM_PARTITIONS
        elif topic.num_partitions > 0:
            total += topic.num_partitions
    return total


def refusal(request: Any, version: int) -> bytes:
    """Kafka's answer to a request over the limit: every topic fails with POLICY_VIOLATION."""
    result = CreateTopicsResponse.CreatableTopicResult
    return bytes(CreateTopicsResponse(version=version, throttle_time_ms=0, topics=[
        result(name=t.name, error_code=POLICY_VIOLATION, error_message=TOO_MANY_PARTITIONS,
               num_partitions=-1, replication_factor=-1, configs=None)
        for t in request.topics]).encode(version=version))


class CreateTopicsLimit(RequestStage):
    """Answers a CreateTopics request for more than MAX_PARTITIONS_PER_REQUEST partitions with
    POLICY_VIOLATION for every topic, as Kafka does, instead of forwarding it."""

    api_keys = frozenset({CREATE_TOPICS})

    def on_request(self, ctx: RequestContext) -> Reply | None:
        request = ctx.decode_request()
        if partitions_requested(request) <= MAX_PARTITIONS_PER_REQUEST:
            return None
        return Reply(refusal(request, ctx.api_version))
