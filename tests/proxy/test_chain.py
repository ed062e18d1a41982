"""proxy/chain.py: the stages each API key's requests and responses pass, in order, with the quota
stages the known kinds name (QuotaKind.stages); a registered request-rate kind adds RequestCounts
and nothing else."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config.settings import parse_values
from kafka_quota_proxy.protocol.api_keys import CREATE_TOPICS, FETCH, LIST_GROUPS, METADATA, PRODUCE
from kafka_quota_proxy.proxy.chain import Pipeline
from kafka_quota_proxy.proxy.server import Proxy
from kafka_quota_proxy.quota.kinds import BUILT_IN, STAGES, kinds, quota_stages, registered
from tests.proxy.conftest import merge
from tests.support.kinds import LIST_GROUPS_RATE


def pipeline() -> Pipeline:
    """The chain a proxy builds (not started: no socket is opened)."""
    return Proxy(merge(parse_values({"upstream": ["127.0.0.1:9092"], "listen": "127.0.0.1:19092"}))).pipeline


def names(stages: tuple[object, ...]) -> list[str]:
    return [type(stage).__name__ for stage in stages]


def test_every_quota_stage_is_named_by_a_built_in_kind_but_request_counts() -> None:
    assert kinds() == BUILT_IN
    assert quota_stages() == set(STAGES) - {"request_counts"}
    assert {kind.key.value: kind.charged_by for kind in BUILT_IN} == {
        "producer_byte_rate": ("topic_quotas", "quota_charge"),
        "consumer_byte_rate": ("topic_quotas", "quota_charge", "quota_settle"),
        "request_percentage": ("quota_charge", "quota_settle"),
        "controller_mutation_rate": ("controller_mutations",),
        "connection_creation_rate": (),  # charged where a connection is accepted
        "producer_ids_rate": ("producer_ids",)}


@pytest.mark.parametrize("api_key, request_stages, response_stages", [
    (PRODUCE, ["WellFormed", "TopicQuotaCharge", "ProducerIdCharge", "QuotaCharge"],
     ["BrokerAddresses", "TopicProduceRefusals", "QuotaSettle", "ThrottleMerge"]),
    (FETCH, ["WellFormed", "FetchAsV15", "TopicQuotaCharge", "QuotaCharge"],
     ["BrokerAddresses", "TopicFetchSettle", "QuotaSettle", "ThrottleMerge"]),
    (CREATE_TOPICS, ["WellFormed", "CreateTopicsLimit", "QuotaCharge", "ControllerMutationCharge"],
     ["QuotaSettle", "ThrottleMerge"]),
    (METADATA, ["WellFormed", "QuotaCharge"], ["BrokerAddresses", "QuotaSettle", "ThrottleMerge"]),
    (LIST_GROUPS, ["WellFormed", "QuotaCharge"], ["QuotaSettle", "ThrottleMerge"]),
])
def test_the_stages_of_each_api_in_order(api_key: int, request_stages: list[str],
                                         response_stages: list[str]) -> None:
    chain = pipeline()
    assert names(chain.request_stages(api_key)) == request_stages
    assert names(chain.response_stages(api_key)) == response_stages


def test_a_registered_request_rate_kind_adds_request_counts_after_the_client_quotas() -> None:
    with registered(LIST_GROUPS_RATE):
        assert quota_stages() == set(STAGES)
        chain = pipeline()
    assert names(chain.request_stages(LIST_GROUPS)) == ["WellFormed", "QuotaCharge", "RequestCounts"]
    assert names(chain.request_stages(METADATA)) == ["WellFormed", "QuotaCharge"]  # it counts ListGroups
    assert names(pipeline().request_stages(LIST_GROUPS)) == ["WellFormed", "QuotaCharge"]  # unregistered
