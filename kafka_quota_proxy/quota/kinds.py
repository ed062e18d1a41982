"""The quota kinds, each declared once: its config key, the entities that may carry it, its value
type, whether Apache Kafka knows it, and the name its throttles are counted under (the metrics'
and the usage log's `quota_type`). Every list of keys by entity, the whole-number keys, the
extension keys and the usage log's throttle types and quota keys are derived from KINDS here.

Kafka is the model: one QuotaType enum (ClientQuotaManager's QuotaType) names each kind, its
config key and its sensor's name. The managers, the metrics and the admin API still name the
kinds they serve themselves; issue 38 moves them here step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey


@dataclass(frozen=True, slots=True)
class QuotaKind:
    key: QuotaKey  # its config key, as kafka-configs and the YAML file spell it
    throttle_type: str  # the quota_type its throttles are counted under
    clients: bool = True  # on user and/or client-id entities (Kafka's client quotas)
    user_alone: bool = False  # on a user entity alone (a name or <default>, no client-id)
    ip: bool = False  # on an ip entity (a name or <default>)
    topic: bool = False  # on a topic entity (the KIP-13 draft's topic quotas: an extension)
    # Kafka's value type (QuotaConfigs): LONG and INT take whole numbers only
    # (ClientQuotaControlManager), DOUBLE any number
    value_type: str = "DOUBLE"
    extension: bool = False  # Kafka does not know it: set and described through the proxy only
    # A tenant's kind, as the usage log and its pipeline report it: the record's counter of what
    # it measures, the pipeline's name for the measure, its quota's unit and a title.
    usage_counter: str | None = None
    measure: str | None = None
    unit: str = ""
    title: str = ""

    @property
    def whole_number(self) -> bool:
        return self.value_type != "DOUBLE"

    @property
    def per_tenant(self) -> bool:
        """Charged to a tenant (a user and/or client-id): the usage log counts its throttles."""
        return self.clients or self.user_alone


KINDS: tuple[QuotaKind, ...] = (
    QuotaKind(QuotaKey.PRODUCER_BYTE_RATE, "produce", topic=True, value_type="LONG",  # KIP-13
              usage_counter="produce_bytes", measure="produce", unit="B/s", title="Produce bytes/s"),
    QuotaKind(QuotaKey.CONSUMER_BYTE_RATE, "fetch", topic=True, value_type="LONG",  # KIP-13
              usage_counter="fetch_bytes", measure="fetch", unit="B/s", title="Fetch bytes/s"),
    # KIP-124. The usage log's request_time_ms over an interval, as Kafka's request_percentage
    # counts it: percent of one thread.
    QuotaKind(QuotaKey.REQUEST_PERCENTAGE, "request", usage_counter="request_time_ms", measure="request",
              unit="%", title="Request time, % of a thread"),
    QuotaKind(QuotaKey.CONTROLLER_MUTATION_RATE, "controller_mutation",  # KIP-599
              usage_counter="partitions_mutated", measure="mutations", unit="partitions/s",
              title="Partition mutations/s"),
    # KIP-612: new connections per second per client address
    QuotaKind(QuotaKey.CONNECTION_CREATION_RATE, "connection_creation_rate", clients=False, ip=True,
              value_type="INT"),
    # KIP-936, which Apache Kafka never shipped: new producer ids per second, per user
    QuotaKind(QuotaKey.PRODUCER_IDS_RATE, "producer_ids", clients=False, user_alone=True, extension=True,
              usage_counter="new_producer_ids", measure="producer_ids", unit="ids/s",
              title="New producer ids/s"),
)
KIND: dict[QuotaKey, QuotaKind] = {kind.key: kind for kind in KINDS}
KEY_NAMES = tuple(kind.key.value for kind in KINDS)  # as the config file and kafka-configs spell them
_NAMED: dict[str, QuotaKind] = {kind.key.value: kind for kind in KINDS}
assert KIND.keys() == set(QuotaKey), "every quota key is one kind"

WHOLE_NUMBER_KEYS = frozenset(k.key for k in KINDS if k.whole_number)
CLIENT_KEYS = frozenset(k.key for k in KINDS if k.clients)
IP_KEYS = frozenset(k.key for k in KINDS if k.ip)
# Keys a user entity alone (a name or <default>, no client-id) may carry, beyond CLIENT_KEYS.
USER_ONLY_KEYS = frozenset(k.key for k in KINDS if k.user_alone and not k.clients)
# Keys Apache Kafka does not know: set and described through the proxy only.
EXTENSION_KEYS = frozenset(k.key for k in KINDS if k.extension)
# A topic's write and read budget (the KIP-13 draft's "quota distribution"). The topic entity
# type is itself an extension: Kafka brokers know no quota on it.
TOPIC_KEYS = frozenset(k.key for k in KINDS if k.topic)
# What the usage log keeps per tenant, in this order: each kind's throttles and its quota.
TENANT_KINDS = tuple(k for k in KINDS if k.per_tenant)


def keys_for(entity: QuotaEntity) -> frozenset[QuotaKey]:
    """The quota keys this entity may carry."""
    if entity.ip is not None:
        return IP_KEYS
    if entity.topic is not None:
        return TOPIC_KEYS
    if entity.client_id is None:
        return CLIENT_KEYS | USER_ONLY_KEYS
    return CLIENT_KEYS


def key_named(name: object) -> QuotaKey | None:
    """The quota key spelled `name` (as kafka-configs and the YAML file spell it), or None for a
    name no kind has."""
    kind = _NAMED.get(name) if isinstance(name, str) else None
    return None if kind is None else kind.key


def throttle_type(key: QuotaKey) -> str:
    """The quota_type a throttle for `key` is counted under."""
    return KIND[key].throttle_type
