"""The producer-id quota (KIP-936, which Apache Kafka never shipped): a Produce's producer ids new
for its user are counted on the user's rate (`ProducerIdQuotaManager`), while some
`producer_ids_rate` has ever been configured. Over the rate the request is throttled as Kafka
throttles (told, its connection muted), or with the `reject` action refused unforwarded
(docs/producer-id-quotas.md). Before QuotaCharge: a refused Produce is not charged its bytes."""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import PRODUCE
from kafka_quota_proxy.protocol.error_codes import THROTTLING_QUOTA_EXCEEDED
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.produce import producer_ids, refusal
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.proxy.stages.throttling import client_of, managers, throttle
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.producer_ids import ProducerIdQuotaManager

PRODUCER_IDS = QuotaKey.PRODUCER_IDS_RATE
# What a Produce refused for the producer-id quota (action `reject`) fails its partitions with:
# THROTTLING_QUOTA_EXCEEDED, the error KIP-599 made for a quota that refuses instead of delaying.
# The Java producer retries it (ThrottlingQuotaExceededException is retriable) until
# delivery.timeout.ms; kafka-python retries it too; librdkafka and aiokafka do not know it for
# Produce and fail the messages at once with this error. docs/producer-id-quotas.md has more.
PRODUCER_ID_REFUSAL = THROTTLING_QUOTA_EXCEEDED


class ProducerIdCharge(RequestStage):
    """Counts a Produce's new producer ids for its user; throttles, or refuses it (`reject`)."""

    api_keys = frozenset({PRODUCE})

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def on_request(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        if PRODUCER_IDS not in engine.switches().enabled:
            return None  # asked of every Produce: one look while no producer_ids_rate is set
        user, client_id = client_of(ctx)
        charging = engine.charging(user, client_id)
        if charging is None:
            return None
        switches, now = charging
        try:
            pids = producer_ids(ctx.frame, ctx.header.body_offset, ctx.api_version)
        except ProtocolError:
            return None  # malformed records: the broker answers CORRUPT_MESSAGE for them
        if not pids:
            return None
        strict = switches.enforcing and engine.settings.producer_ids.action == "reject"
        charge = managers(ctx).of(PRODUCER_IDS, ProducerIdQuotaManager).charge(user, pids, now, strict)
        ctx.charge().new_producer_ids = 0 if charge.rejected else charge.new_ids
        throttle(engine, ctx, PRODUCER_IDS, charge.throttle_ms, now, per_user=True)
        if not charge.rejected:
            return None
        if not ctx.expects_response:
            return Reply(None)  # acks=0: dropped, and the connection muted for the throttle
        message = (f"{charge.new_ids} new producer id(s) would exceed the producer_ids_rate quota "
                   f"of user {user!r}; retry after {charge.throttle_ms} ms")
        return Reply(refusal(ctx.decode_request(), ctx.api_version, PRODUCER_ID_REFUSAL, message,
                             ctx.throttle_ms))
