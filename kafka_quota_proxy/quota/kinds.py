"""The quota kinds, each declared once: its config key, the entities that may carry it, its value
type, whether Apache Kafka knows it, and the name its throttles are counted under (the metrics'
and the usage log's `quota_type`). Every list of keys by entity, the whole-number keys and the
extension keys are derived here from the kinds known: the built-in ones (BUILT_IN) and any
registered since (`register`), so a registered kind's key is configured, validated and described
through the admin API as a built-in one is.

Kafka is the model: one QuotaType enum (ClientQuotaManager's QuotaType) names each kind, its
config key and its sensor's name. A request-rate kind (`QuotaKind.counts`) is enforced, metered
and logged by the shared manager and stage (docs/architecture.md, "A new quota kind"). Each
kind names its manager (`QuotaKind.manager`), from which the engine builds every scope's, and what
the usage meter adds to its counter (`QuotaKind.metered`); the built-in kinds' stages and metric
families still name the kinds they serve themselves.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kafka_quota_proxy.protocol.api_keys import CONTROLLER_MUTATIONS, FETCHES, PRODUCE
from kafka_quota_proxy.quota.entities import QuotaEntity, QuotaKey

# What the usage meter can read of a request for a kind's usage counter (QuotaKind.usage_fact;
# proxy/observability/usage_log.py reads each): read when the request passes the request stages,
# except the two read when its response is written to the client (RESPONSE_FACTS).
REQUEST_BYTES = "request_bytes"  # the request's size without its size prefix
RESPONSE_BYTES = "response_bytes"  # the response's, as written to the client
TIME_MS = "time_ms"  # the request's time at the proxy, in ms, as Kafka's request time counts it
PERMITS = "permits"  # the partitions a mutation request creates or deletes
NEW_PRODUCER_IDS = "new_producer_ids"  # the producer ids a Produce brings that its user had not
REQUESTS = "requests"  # one per request (a request-rate kind's, QuotaKind.counts)
USAGE_FACTS = (REQUEST_BYTES, RESPONSE_BYTES, TIME_MS, PERMITS, NEW_PRODUCER_IDS, REQUESTS)
RESPONSE_FACTS = frozenset({RESPONSE_BYTES, TIME_MS})

# The quota stages a kind is charged by (QuotaKind.stages): proxy/chain.py adds each stage some
# known kind names, where the chain's order puts it (proxy/stages/<name>.py).
STAGE_TOPIC_QUOTAS = "topic_quotas"  # a topic's bytes charged, refused and settled
STAGE_PRODUCER_IDS = "producer_ids"  # a Produce's new producer ids (KIP-936)
STAGE_QUOTA_CHARGE = "quota_charge"  # a client's bytes, and its request time's throttle
STAGE_CONTROLLER_MUTATIONS = "controller_mutations"  # the partitions a request creates or deletes
STAGE_REQUEST_COUNTS = "request_counts"  # a request-rate kind's requests, one each
STAGE_QUOTA_SETTLE = "quota_settle"  # a Fetch's bytes and every request's time, on its response
STAGES = (STAGE_TOPIC_QUOTAS, STAGE_PRODUCER_IDS, STAGE_QUOTA_CHARGE, STAGE_CONTROLLER_MUTATIONS,
          STAGE_REQUEST_COUNTS, STAGE_QUOTA_SETTLE)


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
    # What the meter adds to the usage counter (one of USAGE_FACTS), for which API keys' requests
    # (none: every request's); a request-rate kind's is one per request it counts (`metered`).
    usage_fact: str = ""
    usage_apis: frozenset[int] = frozenset()
    usage_scale: float = 1.0  # one unit of the counter per second, in its quota's unit
    topic_doc: str = ""  # a topic quota's documentation, as DescribeConfigs gives it (`topic`)
    # The quota stages that charge it (STAGES); a request-rate kind's is RequestCounts
    # (`charged_by`). Empty for a kind charged where a connection is accepted (connections).
    stages: tuple[str, ...] = ()
    # Kafka's QuotaType name: the sensor-name prefix ("Produce-u:c") and the JMX `type=` group;
    # "" where Kafka has none (the key is used).
    sensor: str = ""
    # A request-rate kind: the API keys whose requests it charges, one each, on Kafka's Rate per
    # (user, client-id) with Kafka's throttle (a "rate" manager in every scope, the RequestCounts
    # stage). Empty for the built-in kinds, whose stages are their own.
    counts: frozenset[int] = frozenset()
    # A byte rate (KIP-13): the bytes of each request's records on Kafka's Rate, throttled request
    # by request; `byte_rate_enforcement: paced` may pace it, and the pipeline's what-if replays
    # it (analytics/replay.py).
    byte_rate: bool = False
    # The manager that measures it in each scope (the engine builds one per kind of a scope from
    # this): "rate", Kafka's ClientQuotaManager; "request_time", its ClientRequestQuotaManager;
    # "token_bucket", its ControllerMutationQuotaManager; "producer_ids", KIP-936's
    # ProducerIdQuotaManager; "connections", Kafka's ConnectionQuotas, one per proxy, not per
    # scope. A registered kind is "rate" (it counts requests).
    manager: str = "rate"
    # The name its measurements are shared under across replicas (`store:`), and its topic
    # quota's with "topic-" before it; "" where they are not shared.
    shared: str = ""

    @property
    def whole_number(self) -> bool:
        return self.value_type != "DOUBLE"

    @property
    def metered(self) -> tuple[str, frozenset[int]]:
        """What the usage meter adds to the kind's usage counter, and for which API keys (none:
        every request); ("", ...) for a kind it does not meter."""
        if self.usage_fact or not self.counts:
            return self.usage_fact, self.usage_apis
        return REQUESTS, self.counts

    @property
    def charged_by(self) -> tuple[str, ...]:
        """The quota stages that charge it: its own, or a request-rate kind's RequestCounts."""
        return self.stages or ((STAGE_REQUEST_COUNTS,) if self.counts else ())

    @property
    def topic_sensor(self) -> str:
        """The sensor-name prefix of its topic quota (`topic`): "TopicProduce" beside Kafka's
        "Produce"."""
        return "Topic" + (self.sensor or self.key.value)

    @property
    def per_tenant(self) -> bool:
        """Charged to a tenant (a user and/or client-id): the usage log counts its throttles."""
        return self.clients or self.user_alone


BUILT_IN: tuple[QuotaKind, ...] = (
    QuotaKind(QuotaKey.PRODUCER_BYTE_RATE, "produce", topic=True, value_type="LONG",  # KIP-13
              usage_counter="produce_bytes", measure="produce", unit="B/s", title="Produce bytes/s",
              usage_fact=REQUEST_BYTES, usage_apis=frozenset({PRODUCE}),
              topic_doc="The topic's quota at the proxy: bytes per second written to it by all clients "
                        "together (docs/topic-quotas.md).",
              stages=(STAGE_TOPIC_QUOTAS, STAGE_QUOTA_CHARGE), sensor="Produce", byte_rate=True,
              shared="produce"),
    QuotaKind(QuotaKey.CONSUMER_BYTE_RATE, "fetch", topic=True, value_type="LONG",  # KIP-13
              usage_counter="fetch_bytes", measure="fetch", unit="B/s", title="Fetch bytes/s",
              usage_fact=RESPONSE_BYTES, usage_apis=FETCHES,  # a ShareFetch's bytes are fetched bytes too
              topic_doc="The topic's quota at the proxy: bytes per second read from it by all clients "
                        "together (docs/topic-quotas.md).",
              stages=(STAGE_TOPIC_QUOTAS, STAGE_QUOTA_CHARGE, STAGE_QUOTA_SETTLE), sensor="Fetch",
              byte_rate=True, shared="fetch"),
    # KIP-124. The usage log's request_time_ms over an interval, as Kafka's request_percentage
    # counts it: percent of one thread (1 ms a second is 0.1 %).
    QuotaKind(QuotaKey.REQUEST_PERCENTAGE, "request", usage_counter="request_time_ms", measure="request",
              unit="%", title="Request time, % of a thread", usage_fact=TIME_MS, usage_scale=0.1,
              stages=(STAGE_QUOTA_CHARGE, STAGE_QUOTA_SETTLE), sensor="Request", manager="request_time"),
    QuotaKind(QuotaKey.CONTROLLER_MUTATION_RATE, "controller_mutation",  # KIP-599
              usage_counter="partitions_mutated", measure="mutations", unit="partitions/s",
              title="Partition mutations/s", usage_fact=PERMITS, usage_apis=CONTROLLER_MUTATIONS,
              stages=(STAGE_CONTROLLER_MUTATIONS,), sensor="ControllerMutation", manager="token_bucket",
              shared="mutation"),
    # KIP-612: new connections per second per client address
    QuotaKind(QuotaKey.CONNECTION_CREATION_RATE, "connection_creation_rate", clients=False, ip=True,
              value_type="INT", manager="connections"),
    # KIP-936, which Apache Kafka never shipped: new producer ids per second, per user
    QuotaKind(QuotaKey.PRODUCER_IDS_RATE, "producer_ids", clients=False, user_alone=True, extension=True,
              usage_counter="new_producer_ids", measure="producer_ids", unit="ids/s",
              title="New producer ids/s", usage_fact=NEW_PRODUCER_IDS, usage_apis=frozenset({PRODUCE}),
              stages=(STAGE_PRODUCER_IDS,), sensor="ProducerIds",  # KIP-936's ProducerIdQuotaManager
              manager="producer_ids", shared="pids"),
)
BUILT_IN_KEYS = tuple(kind.key for kind in BUILT_IN)


class Registry:
    """The kinds known, and every list derived from them, made again when a kind is registered."""

    def __init__(self, kinds: tuple[QuotaKind, ...]) -> None:
        self.kinds = kinds
        self.by_key: dict[QuotaKey, QuotaKind] = {kind.key: kind for kind in kinds}
        if len(self.by_key) != len(kinds):
            raise ValueError("a quota key is declared twice")
        self.names = tuple(kind.key.value for kind in kinds)  # as the config file spells them
        self.whole_number = frozenset(k.key for k in kinds if k.whole_number)
        self.clients = frozenset(k.key for k in kinds if k.clients)
        self.ip = frozenset(k.key for k in kinds if k.ip)
        self.user_only = frozenset(k.key for k in kinds if k.user_alone and not k.clients)
        self.extension = frozenset(k.key for k in kinds if k.extension)
        self.topic = frozenset(k.key for k in kinds if k.topic)
        self.tenant = tuple(k for k in kinds if k.per_tenant)
        self.counted = tuple(k for k in kinds if k.counts)
        self.byte_rates = tuple(k for k in kinds if k.byte_rate)
        self.stages = frozenset(stage for k in kinds for stage in k.charged_by)
        if not self.stages <= set(STAGES):
            raise ValueError(f"no such quota stage: {', '.join(sorted(self.stages - set(STAGES)))}")


_known = Registry(BUILT_IN)


def register(kind: QuotaKind) -> None:
    """Add `kind`: from now on its key is configured, validated and described as the built-in
    ones are. ValueError if its key is taken."""
    global _known
    if kind.key in _known.by_key:
        raise ValueError(f"quota key {kind.key.value} is already declared")
    if kind.byte_rate:
        raise ValueError(f"quota key {kind.key.value}: a byte rate is built in (its bytes are read by "
                         "its own stages); a registered kind counts requests (QuotaKind.counts)")
    fact, _ = kind.metered
    if kind.usage_counter and fact not in USAGE_FACTS:
        raise ValueError(f"quota key {kind.key.value}: its usage counter needs a usage fact the meter reads "
                         f"(one of {', '.join(USAGE_FACTS)}), or the requests it counts")
    if kind.charged_by not in ((), (STAGE_REQUEST_COUNTS,)):
        raise ValueError(f"quota key {kind.key.value}: a registered kind is charged by the request_counts "
                         "stage (the requests it counts, QuotaKind.counts), not by its own stages")
    if kind.topic:
        raise ValueError(f"quota key {kind.key.value}: a topic quota is a byte rate, built in (its bytes are "
                         "read by the topic stages)")
    if kind.manager != "rate" or kind.shared:
        raise ValueError(f"quota key {kind.key.value}: a registered kind counts requests on Kafka's Rate "
                         "(manager \"rate\"), measured by each replica alone (no `shared` name)")
    _known = Registry((*_known.kinds, kind))


def unregister(key: QuotaKey) -> None:
    """Take a registered kind out again (tests); the built-in kinds stay."""
    global _known
    if any(kind.key == key for kind in BUILT_IN):
        raise ValueError(f"quota key {key.value} is built in")
    _known = Registry(tuple(kind for kind in _known.kinds if kind.key != key))


@contextmanager
def registered(kind: QuotaKind) -> Iterator[QuotaKind]:
    """`kind` registered for the duration of a with block."""
    register(kind)
    try:
        yield kind
    finally:
        unregister(kind.key)


def kinds() -> tuple[QuotaKind, ...]:
    """Every kind, the built-in ones first in Kafka's order, then the registered ones."""
    return _known.kinds


def kind_of(key: QuotaKey) -> QuotaKind:
    """What `key` is; KeyError for a key no kind declares."""
    return _known.by_key[key]


def key_names() -> tuple[str, ...]:
    """Every key as the config file and kafka-configs spell it."""
    return _known.names


def whole_number_keys() -> frozenset[QuotaKey]:
    """The keys Kafka takes whole numbers for (LONG and INT)."""
    return _known.whole_number


def client_keys() -> frozenset[QuotaKey]:
    """The keys user and/or client-id entities may carry (Kafka's client quotas)."""
    return _known.clients


def ip_keys() -> frozenset[QuotaKey]:
    return _known.ip


def user_only_keys() -> frozenset[QuotaKey]:
    """Keys a user entity alone (a name or <default>, no client-id) may carry, beyond
    client_keys()."""
    return _known.user_only


def extension_keys() -> frozenset[QuotaKey]:
    """Keys Apache Kafka does not know: set and described through the proxy only."""
    return _known.extension


def topic_keys() -> frozenset[QuotaKey]:
    """A topic's write and read budget (the KIP-13 draft's "quota distribution"). The topic entity
    type is itself an extension: Kafka brokers know no quota on it."""
    return _known.topic


def tenant_kinds() -> tuple[QuotaKind, ...]:
    """What the usage log keeps per tenant, in this order: each kind's throttles and its quota."""
    return _known.tenant


def keys_for(entity: QuotaEntity) -> frozenset[QuotaKey]:
    """The quota keys this entity may carry."""
    known = _known
    if entity.ip is not None:
        return known.ip
    if entity.topic is not None:
        return known.topic
    if entity.client_id is None:
        return known.clients | known.user_only
    return known.clients


def key_named(name: object) -> QuotaKey | None:
    """The quota key spelled `name` (as kafka-configs and the YAML file spell it), or None for a
    name no kind has."""
    kind = _known.by_key.get(name) if isinstance(name, str) else None  # type: ignore[call-overload]
    return None if kind is None else kind.key


def sensor_name(key: QuotaKey) -> str:
    """Kafka's QuotaType name for `key` (the sensor-name prefix), or the key where Kafka has none."""
    return _known.by_key[key].sensor or key.value


def counted_kinds() -> tuple[QuotaKind, ...]:
    """The request-rate kinds (`QuotaKind.counts`): registered kinds served by the generic manager
    and stage."""
    return _known.counted


def counting(counted: Sequence[QuotaKind]) -> dict[int, tuple[int, ...]]:
    """For each API key that request-rate kinds count (`QuotaKind.counts`), the indexes in
    `counted` of the kinds that count it: what the RequestCounts stage charges and the usage
    meter counts for one request."""
    found: dict[int, list[int]] = {}
    for i, kind in enumerate(counted):
        for api in kind.counts:
            found.setdefault(api, []).append(i)
    return {api: tuple(indexes) for api, indexes in found.items()}


def quota_stages() -> frozenset[str]:
    """The quota stages the known kinds are charged by (QuotaKind.charged_by): those the chain
    adds."""
    return _known.stages


def byte_rate_kinds() -> tuple[QuotaKind, ...]:
    """The byte rates (`QuotaKind.byte_rate`): Produce and Fetch bytes among the built-in kinds."""
    return _known.byte_rates


def throttle_type(key: QuotaKey) -> str:
    """The quota_type a throttle for `key` is counted under."""
    return _known.by_key[key].throttle_type
