"""The stage chains: the request stages in order, then the broker; the response stages in order,
then the client. Each stage names the API keys it cares about, and the chain for a key is
computed once, so a frame no stage asked for is forwarded after its header is read and its body's
lengths are checked (WellFormed, the one stage for every key).
`build_pipeline` is the one place the order is written. A new quota kind is declared in
quota/kinds.py, with the quota stages that charge it (`QuotaKind.stages`): the chain adds each
quota stage some known kind names, where its order puts it. A request-rate kind
(`QuotaKind.counts`) needs nothing more: its manager is Kafka's Rate and its stage RequestCounts,
shared by all such kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from kafka_quota_proxy.protocol.api_keys import SASL_AUTHENTICATE, SASL_HANDSHAKE
from kafka_quota_proxy.protocol.headers import response_body_offset, response_prefix
from kafka_quota_proxy.protocol.pieces import Pieces
from kafka_quota_proxy.proxy.cluster import Cluster
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.access import QuotaAccess
from kafka_quota_proxy.proxy.quota_runtime.control import QuotaControl
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.stages.api_versions import ApiVersionsGate, ApiVersionsIntersect
from kafka_quota_proxy.proxy.stages.base import RequestStage, ResponseStage
from kafka_quota_proxy.proxy.stages.broker_addresses import BrokerAddresses
from kafka_quota_proxy.proxy.stages.client_quotas_api import SERVED, ClientQuotasApi
from kafka_quota_proxy.proxy.stages.controller_mutations import ControllerMutationCharge
from kafka_quota_proxy.proxy.stages.create_topics_limit import CreateTopicsLimit
from kafka_quota_proxy.proxy.stages.fetch_as_v15 import FetchAsV15
from kafka_quota_proxy.proxy.stages.producer_ids import ProducerIdCharge
from kafka_quota_proxy.proxy.stages.quota_charge import QuotaCharge
from kafka_quota_proxy.proxy.stages.quota_settle import QuotaSettle
from kafka_quota_proxy.proxy.stages.request_counts import RequestCounts
from kafka_quota_proxy.proxy.stages.sasl_inspect import SaslInspect
from kafka_quota_proxy.proxy.stages.sasl_terminate import SaslTerminate
from kafka_quota_proxy.proxy.stages.throttle_merge import ThrottleMerge
from kafka_quota_proxy.proxy.stages.token_owners_seen import TokenOwnersSeen
from kafka_quota_proxy.proxy.stages.topic_configs import (
    TopicConfigsAlter,
    TopicConfigsAnswer,
    TopicConfigsDescribe,
)
from kafka_quota_proxy.proxy.stages.topic_quotas import (
    TopicFetchSettle,
    TopicProduceRefusals,
    TopicQuotaCharge,
    TopicShareFetchSettle,
)
from kafka_quota_proxy.proxy.stages.topic_usage import FetchTopicBytes, ProduceTopicBytes
from kafka_quota_proxy.proxy.stages.well_formed import WellFormed
from kafka_quota_proxy.quota.kinds import (
    STAGE_CONTROLLER_MUTATIONS,
    STAGE_PRODUCER_IDS,
    STAGE_QUOTA_CHARGE,
    STAGE_QUOTA_SETTLE,
    STAGE_REQUEST_COUNTS,
    STAGE_TOPIC_QUOTAS,
    counted_kinds,
    quota_stages,
)

# A response ready to write: one buffer, or pieces written with writelines (no joining copy).
Response = bytes | memoryview | list[bytes | memoryview]
# APIs the proxy answers itself in terminate mode: SaslHandshake v0-1, SaslAuthenticate v0-2.
TERMINATED_SASL_APIS = ((SASL_HANDSHAKE, 0, 1), (SASL_AUTHENTICATE, 0, 2))


def build_pipeline(sasl: SaslInspect | SaslTerminate | None, quota_control: QuotaControl,
                   engine: QuotaEngine, cluster: Cluster, access: QuotaAccess,
                   topic_usage: bool = False) -> Pipeline:
    """The request and response stages, in the order a request and its response pass them.
    `topic_usage`: the usage log counts bytes per topic (`usage_log.topics`)."""
    terminate = isinstance(sasl, SaslTerminate)
    charged_by = quota_stages()  # the quota stages some kind known names (QuotaKind.stages)
    # A body that does not parse goes no further than the ApiVersions gate (which answers
    # versions newer than the codec, whose bodies cannot be checked).
    request: list[RequestStage] = [ApiVersionsGate(), WellFormed()]
    response: list[ResponseStage] = [
        ApiVersionsIntersect(served=SERVED + (TERMINATED_SASL_APIS if terminate else ()))]
    if isinstance(sasl, SaslTerminate):
        request.append(sasl)  # before anything that would act for the client
    elif isinstance(sasl, SaslInspect):
        request.append(sasl)
        response.append(sasl)
        if sasl.tokens is not None:
            response.append(TokenOwnersSeen(sasl.tokens))
    # Topic quotas before client quotas: a client is charged for the bytes that go on, not for
    # a topic's refused ones, and its fetch for what it is delivered.
    request += [ClientQuotasApi(quota_control, engine, access),
                TopicConfigsAlter(quota_control, engine, access),
                TopicConfigsDescribe(quota_control, engine, access), CreateTopicsLimit(), FetchAsV15()]
    response += [BrokerAddresses(cluster.advertise, cluster.observe_metadata),
                 TopicConfigsAnswer(quota_control)]
    if STAGE_TOPIC_QUOTAS in charged_by:
        request.append(TopicQuotaCharge(engine))
        response += [TopicProduceRefusals(engine), TopicFetchSettle(engine), TopicShareFetchSettle(engine)]
    if topic_usage:  # after the topic quotas, which count what they measure themselves
        request.append(ProduceTopicBytes(engine.leadership))
        response.append(FetchTopicBytes(engine.leadership))
    # Producer ids before the bytes: a Produce refused for its new ids is not charged its bytes.
    # In this order, each where some kind names it:
    charges: dict[str, Callable[[], RequestStage]] = {
        STAGE_PRODUCER_IDS: lambda: ProducerIdCharge(engine),
        STAGE_QUOTA_CHARGE: lambda: QuotaCharge(engine),
        STAGE_CONTROLLER_MUTATIONS: lambda: ControllerMutationCharge(engine, cluster.topic_partitions),
        STAGE_REQUEST_COUNTS: lambda: RequestCounts(engine, counted_kinds()),
    }
    request += [make() for stage, make in charges.items() if stage in charged_by]
    if STAGE_QUOTA_SETTLE in charged_by:
        response.append(QuotaSettle(engine))
    response.append(ThrottleMerge())
    return Pipeline(request=request, response=response)


def _for_key(stages: Iterable[RequestStage | ResponseStage], api_key: int) -> tuple:
    return tuple(s for s in stages if s.api_keys is None or api_key in s.api_keys)


class Pipeline:
    """The two chains, with the per-key selection cached."""

    def __init__(self, request: Sequence[RequestStage], response: Sequence[ResponseStage]) -> None:
        self._request = tuple(request)
        self._response = tuple(response)
        self._request_by_key: dict[int, tuple[RequestStage, ...]] = {}
        self._holds_by_key: dict[int, tuple[RequestStage, ...]] = {}
        self._response_by_key: dict[int, tuple[ResponseStage, ...]] = {}

    def request_stages(self, api_key: int) -> tuple[RequestStage, ...]:
        found = self._request_by_key.get(api_key)
        if found is None:
            found = self._request_by_key[api_key] = _for_key(self._request, api_key)
        return found

    def request_holds(self, api_key: int) -> tuple[RequestStage, ...]:
        """The request stages for this key that may hold a request (`RequestStage.hold_ms`):
        none for most keys, so most requests pay one dictionary look-up for it."""
        found = self._holds_by_key.get(api_key)
        if found is None:
            found = self._holds_by_key[api_key] = tuple(
                s for s in self.request_stages(api_key) if api_key in s.holds)
        return found

    def response_stages(self, api_key: int) -> tuple[ResponseStage, ...]:
        found = self._response_by_key.get(api_key)
        if found is None:
            found = self._response_by_key[api_key] = _for_key(self._response, api_key)
        return found

    def run_response_stages(self, ctx: RequestContext, frame: memoryview) -> Response:
        """The response stages over one whole response; the frame itself when none changed it."""
        body_at = -1
        body: memoryview | Pieces = frame
        changed = False
        for stage in self.response_stages(ctx.api_key):
            # Asked stage by stage: an earlier stage can make a later one wanted (a quota
            # throttle makes ThrottleMerge write throttle_time_ms).
            if not stage.wants(ctx):
                continue
            if body_at < 0:
                spec = ctx.header.spec
                assert spec is not None
                body_at = response_body_offset(frame, spec.response_header_version(ctx.api_version))
                body = frame[body_at:]
            if isinstance(body, Pieces):  # a later stage needs one contiguous body
                body = memoryview(body.join())
            new_body = stage.on_response(ctx, body)
            if new_body is not None:
                body = new_body if isinstance(new_body, Pieces) else memoryview(new_body)
                changed = True
        if not changed:
            return frame
        # The broker's response header (correlation id, header tags) is kept as it was.
        prefix = response_prefix(frame, body_at, len(body))
        if isinstance(body, Pieces):
            return [prefix, *body.parts]  # the body itself is not copied
        return prefix + bytes(body)
