"""The controller-mutation quota (KIP-599, `controller_mutation_rate`): the partitions a
CreateTopics, CreatePartitions or DeleteTopics request creates or deletes are charged to the
client's token bucket (quota/mutations.py). From the versions KIP-599 made strict (STRICT_FROM),
a request over the quota is refused unforwarded, every topic failed with THROTTLING_QUOTA_EXCEEDED
and the throttle told; older versions go through and are throttled afterwards, as on Kafka's
broker (ControllerMutationQuotaManager's strict and permissive quotas)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka.protocol.admin.topics import (
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
)

from kafka_quota_proxy.protocol.api_keys import CREATE_PARTITIONS, CREATE_TOPICS, DELETE_TOPICS
from kafka_quota_proxy.protocol.error_codes import THROTTLING_QUOTA_EXCEEDED
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.proxy.stages.throttling import client_of, managers, throttle
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.mutations import ControllerMutationQuotaManager

# Strict (KIP-599) from these versions: over quota is refused, not throttled afterwards.
STRICT_FROM = {CREATE_TOPICS: 6, DELETE_TOPICS: 5, CREATE_PARTITIONS: 3}
THROTTLING_MESSAGE = "The throttling quota has been exceeded."
DEFAULT_NUM_PARTITIONS = 1  # Kafka's num.partitions default, for CreateTopics with -1

TopicPartitions = Callable[[str], int | None]  # partition count of a topic, if known


class ControllerMutationCharge(RequestStage):
    """Charges a request's partition mutations to its client's token bucket; refuses one over the
    quota from the strict versions on (mode enforce), throttles it afterwards before them."""

    api_keys = frozenset(STRICT_FROM)

    def __init__(self, engine: QuotaEngine, topic_partitions: TopicPartitions) -> None:
        self.engine = engine
        self.topic_partitions = topic_partitions

    def on_request(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        user, client_id = client_of(ctx)
        charging = engine.charging(user, client_id)
        if charging is None:
            return None
        switches, now = charging
        bucket = managers(ctx).of(QuotaKey.CONTROLLER_MUTATION_RATE, ControllerMutationQuotaManager)
        request = ctx.decode_request()
        permits = ctx.charge().permits = mutation_permits(ctx.api_key, request, self.topic_partitions)
        if ctx.api_version >= STRICT_FROM[ctx.api_key] and switches.enforcing:
            accepted, throttle_ms = bucket.record_strict(user, client_id, permits, now)
            if not accepted:
                throttle(engine, ctx, QuotaKey.CONTROLLER_MUTATION_RATE, throttle_ms, now)
                return Reply(_refusal(ctx.api_key, ctx.api_version, request, throttle_ms))
            return None
        throttle(engine, ctx, QuotaKey.CONTROLLER_MUTATION_RATE,
                 bucket.record_permissive(user, client_id, permits, now), now)
        return None


def mutation_permits(api_key: int, request: Any, topic_partitions: TopicPartitions) -> int:
    """Partitions created or deleted by a decoded CreateTopics, CreatePartitions or DeleteTopics
    request, as KIP-599 counts them."""
    if api_key == CREATE_TOPICS:
        total = 0
        for topic in request.topics:
            if topic.assignments:
                total += len(topic.assignments)
            else:
                total += topic.num_partitions if topic.num_partitions > 0 else DEFAULT_NUM_PARTITIONS
        return total
    if api_key == CREATE_PARTITIONS:
        total = 0
        for topic in request.topics:
            current = topic_partitions(topic.name)
            total += max(topic.count - current, 0) if current is not None else topic.count
        return total
    names = (request.topic_names or []) if request.API_VERSION < 6 else [t.name for t in request.topics]
    # A topic named only by id (v6+) counts too: its partition count is not known here.
    return sum((topic_partitions(name) if name else None) or 1 for name in names)


def _refusal(api_key: int, version: int, request: Any, throttle_ms: int) -> bytes:
    """The strict-mode answer: every topic fails with THROTTLING_QUOTA_EXCEEDED."""
    if api_key == CREATE_TOPICS:
        cls: Any = CreateTopicsResponse
        topics = [cls.CreatableTopicResult(name=t.name, error_code=THROTTLING_QUOTA_EXCEEDED,
                                           error_message=THROTTLING_MESSAGE, num_partitions=-1,
                                           replication_factor=-1, configs=None)
                  for t in request.topics]
        msg = cls(version=version, throttle_time_ms=throttle_ms, topics=topics)
    elif api_key == CREATE_PARTITIONS:
        cls = CreatePartitionsResponse
        msg = cls(version=version, throttle_time_ms=throttle_ms, results=[
            cls.CreatePartitionsTopicResult(name=t.name, error_code=THROTTLING_QUOTA_EXCEEDED,
                                            error_message=THROTTLING_MESSAGE)
            for t in request.topics])
    else:
        cls = DeleteTopicsResponse
        names = (request.topic_names or []) if version < 6 else [t.name for t in request.topics]
        ids = [None] * len(names) if version < 6 else [t.topic_id for t in request.topics]
        msg = cls(version=version, throttle_time_ms=throttle_ms, responses=[
            cls.DeletableTopicResult(name=n, topic_id=i, error_code=THROTTLING_QUOTA_EXCEEDED,
                                     error_message=THROTTLING_MESSAGE)
            for n, i in zip(names, ids, strict=True)])
    return bytes(msg.encode(version=version))


