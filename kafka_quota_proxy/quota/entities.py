"""Quota entities and the configured quotas: the data model every quota piece shares.

An entity is Kafka's: a user and/or a client-id, each either a name or `<default>`, or an ip
(a name or `<default>`). The proxy adds a fourth, alone like ip: a topic (a name or `<default>`),
for topic quotas (docs/topic-quotas.md). Quota keys are Kafka's config names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

DEFAULT = "<default>"  # the default entity, as Kafka's quota managers spell it


class QuotaKey(str):
    """A quota config key, as kafka-configs and the YAML file spell it: a string. The keys are an
    open set: the built-in ones are named here, and quota/kinds.py declares what each key is (its
    entities, value type, throttle type), a kind registered there adding its own."""

    __slots__ = ()

    PRODUCER_BYTE_RATE: ClassVar[QuotaKey]
    CONSUMER_BYTE_RATE: ClassVar[QuotaKey]
    REQUEST_PERCENTAGE: ClassVar[QuotaKey]
    CONTROLLER_MUTATION_RATE: ClassVar[QuotaKey]
    CONNECTION_CREATION_RATE: ClassVar[QuotaKey]
    # KIP-936, which Apache Kafka never shipped: new producer ids per second, for user entities
    # only. An extension key: only this proxy understands it.
    PRODUCER_IDS_RATE: ClassVar[QuotaKey]

    @property
    def value(self) -> str:
        """The key as a plain string (as an enum member's value: the name it is spelled by)."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"QuotaKey({str.__repr__(self)})"


QuotaKey.PRODUCER_BYTE_RATE = QuotaKey("producer_byte_rate")
QuotaKey.CONSUMER_BYTE_RATE = QuotaKey("consumer_byte_rate")
QuotaKey.REQUEST_PERCENTAGE = QuotaKey("request_percentage")
QuotaKey.CONTROLLER_MUTATION_RATE = QuotaKey("controller_mutation_rate")
QuotaKey.CONNECTION_CREATION_RATE = QuotaKey("connection_creation_rate")
QuotaKey.PRODUCER_IDS_RATE = QuotaKey("producer_ids_rate")


ENTITY_TYPES = ("user", "client-id", "ip", "topic")  # Kafka's words, in the order entities print


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """One quota entity. A field is None when that entity type is not part of it; DEFAULT for
    the `<default>` entity of that type. Either ip alone, topic alone, or user and/or
    client_id."""

    user: str | None = None
    client_id: str | None = None
    ip: str | None = None
    topic: str | None = None

    def __post_init__(self) -> None:
        if self.ip is not None and (self.user is not None or self.client_id is not None):
            raise ValueError("an ip entity cannot be combined with user or client-id")
        if self.topic is not None and (self.user is not None or self.client_id is not None
                                       or self.ip is not None):
            raise ValueError("a topic entity cannot be combined with user, client-id or ip")
        if self.ip is None and self.user is None and self.client_id is None and self.topic is None:
            raise ValueError("an entity needs a user, a client-id, an ip or a topic")

    def names(self) -> tuple[str | None, str | None, str | None, str | None]:
        """The name of each entity type, in ENTITY_TYPES' order; None where absent."""
        return self.user, self.client_id, self.ip, self.topic

    def describe(self) -> str:
        return ", ".join(f"{kind}={value}" for kind, value in self.items())

    def items(self) -> Iterator[tuple[str, str]]:
        """(entity type, name) pairs in Kafka's words: user, client-id, ip, topic."""
        for kind, value in zip(ENTITY_TYPES, self.names(), strict=True):
            if value is not None:
                yield kind, value


QuotaValues = Mapping[QuotaKey, float]
