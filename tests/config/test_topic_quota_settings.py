"""Topic entries in the `quotas:` list: parsed like every entity, with Kafka's value rules and
the topic's own keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_quota_proxy.config import ConfigError, merge
from kafka_quota_proxy.config.settings import load_file, parse_values
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey

UPSTREAM = {"upstream": "127.0.0.1:9092"}


def test_topic_entries_are_read() -> None:
    settings = merge(parse_values({**UPSTREAM, "quotas": [
        {"topic": "orders", "producer_byte_rate": 1048576, "consumer_byte_rate": 2097152},
        {"topic": DEFAULT, "producer_byte_rate": 524288},
    ]}))
    assert [(e.entity, dict(e.values)) for e in settings.quotas] == [
        (QuotaEntity(topic="orders"), {QuotaKey.PRODUCER_BYTE_RATE: 1048576.0,
                                       QuotaKey.CONSUMER_BYTE_RATE: 2097152.0}),
        (QuotaEntity(topic=DEFAULT), {QuotaKey.PRODUCER_BYTE_RATE: 524288.0}),
    ]


@pytest.mark.parametrize(("entry", "key", "fragment"), [
    ({"topic": "t", "user": "u", "producer_byte_rate": 10}, "quotas[0]",
     "a topic entity cannot be combined with user, client-id or ip"),
    ({"topic": "t", "request_percentage": 10}, "quotas[0]",
     "Invalid configuration key request_percentage"),
    ({"topic": "t", "producer_byte_rate": 0.5}, "quotas[0]", "cannot be a fractional value"),
    ({"topic": "", "producer_byte_rate": 10}, "quotas[0].topic", "expected a name or <default>"),
], ids=["with-user", "request-key", "fractional", "empty-name"])
def test_bad_topic_entries_are_config_errors(tmp_path: Path, entry: dict[str, Any], key: str,
                                             fragment: str) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump({**UPSTREAM, "quotas": [entry]}))
    with pytest.raises(ConfigError) as exc:
        load_file(path)
    assert exc.value.key == key
    assert fragment in str(exc.value)
