"""A scope's managers of the built-in kinds, by name, for tests: ScopeManagers holds them by
quota key (quota/kinds.py declares which manager each kind has)."""

from __future__ import annotations

from kafka_quota_proxy.proxy.quota_runtime.engine import ScopeManagers
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.managers import ClientQuotaManager, ClientRequestQuotaManager
from kafka_quota_proxy.quota.mutations import ControllerMutationQuotaManager
from kafka_quota_proxy.quota.producer_ids import ProducerIdQuotaManager
from kafka_quota_proxy.quota.topics import TopicQuotaManager


def produce_bytes(q: ScopeManagers) -> ClientQuotaManager:
    return q.rates[QuotaKey.PRODUCER_BYTE_RATE]


def fetch_bytes(q: ScopeManagers) -> ClientQuotaManager:
    return q.rates[QuotaKey.CONSUMER_BYTE_RATE]


def request_time(q: ScopeManagers) -> ClientRequestQuotaManager:
    return q.of(QuotaKey.REQUEST_PERCENTAGE, ClientRequestQuotaManager)


def mutation_bucket(q: ScopeManagers) -> ControllerMutationQuotaManager:
    return q.of(QuotaKey.CONTROLLER_MUTATION_RATE, ControllerMutationQuotaManager)


def producer_id_rate(q: ScopeManagers) -> ProducerIdQuotaManager:
    return q.of(QuotaKey.PRODUCER_IDS_RATE, ProducerIdQuotaManager)


def topic_produce(q: ScopeManagers) -> TopicQuotaManager:
    return q.topics[QuotaKey.PRODUCER_BYTE_RATE]


def topic_fetch(q: ScopeManagers) -> TopicQuotaManager:
    return q.topics[QuotaKey.CONSUMER_BYTE_RATE]
