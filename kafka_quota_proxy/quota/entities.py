"""Quota entities and the configured quotas: the data model every quota piece shares.

An entity is Kafka's: a user and/or a client-id, each either a name or `<default>`, or an ip
(a name or `<default>`). Quota keys are Kafka's config names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

DEFAULT = "<default>"  # the default entity, as Kafka's quota managers spell it


class QuotaKey(StrEnum):
    """A quota config key, as kafka-configs and the YAML file spell it."""

    PRODUCER_BYTE_RATE = "producer_byte_rate"
    CONSUMER_BYTE_RATE = "consumer_byte_rate"
    REQUEST_PERCENTAGE = "request_percentage"
    CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
    CONNECTION_CREATION_RATE = "connection_creation_rate"
    # KIP-936, which Apache Kafka never shipped: new producer ids per second, for user entities
    # only. An extension key: only this proxy understands it.
    PRODUCER_IDS_RATE = "producer_ids_rate"


# Kafka's value types (ClientQuotaControlManager / QuotaConfigs): LONG and INT keys take whole
# numbers only.
WHOLE_NUMBER_KEYS = frozenset({QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE,
                               QuotaKey.CONNECTION_CREATION_RATE})
CLIENT_KEYS = frozenset({QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE,
                         QuotaKey.REQUEST_PERCENTAGE, QuotaKey.CONTROLLER_MUTATION_RATE})
IP_KEYS = frozenset({QuotaKey.CONNECTION_CREATION_RATE})
# Keys a user entity alone (a name or <default>, no client-id) may carry, beyond CLIENT_KEYS.
USER_ONLY_KEYS = frozenset({QuotaKey.PRODUCER_IDS_RATE})
# Keys Apache Kafka does not know: set and described through the proxy only.
EXTENSION_KEYS = USER_ONLY_KEYS


def keys_for(entity: QuotaEntity) -> frozenset[QuotaKey]:
    """The quota keys this entity may carry."""
    if entity.ip is not None:
        return IP_KEYS
    if entity.client_id is None:
        return CLIENT_KEYS | USER_ONLY_KEYS
    return CLIENT_KEYS


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """One quota entity. A field is None when that entity type is not part of it; DEFAULT for
    the `<default>` entity of that type. Either ip alone, or user and/or client_id."""

    user: str | None = None
    client_id: str | None = None
    ip: str | None = None

    def __post_init__(self) -> None:
        if self.ip is not None and (self.user is not None or self.client_id is not None):
            raise ValueError("an ip entity cannot be combined with user or client-id")
        if self.ip is None and self.user is None and self.client_id is None:
            raise ValueError("an entity needs a user, a client-id or an ip")

    def describe(self) -> str:
        parts = []
        for kind, value in (("user", self.user), ("client-id", self.client_id), ("ip", self.ip)):
            if value is not None:
                parts.append(f"{kind}={value}")
        return ", ".join(parts)

    def items(self) -> Iterator[tuple[str, str]]:
        """(entity type, name) pairs in Kafka's words: user, client-id, ip."""
        for kind, value in (("user", self.user), ("client-id", self.client_id), ("ip", self.ip)):
            if value is not None:
                yield kind, value


QuotaValues = Mapping[QuotaKey, float]
