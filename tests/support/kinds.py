"""Issue 38's toy quota kind, declared in one registry line: a cap on a client's ListGroups
requests per second, Kafka's INT value type, an extension Kafka does not know, the requests it
counts, and the usage log's counter of them. Tests register it for their own span
(`quota.kinds.registered`)."""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import LIST_GROUPS
from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import QuotaKind

LIST_GROUPS_RATE = QuotaKind(QuotaKey("list_groups_request_rate"), "list_groups", value_type="INT",
                             extension=True, counts=frozenset({LIST_GROUPS}),
                             usage_counter="list_groups_requests")
