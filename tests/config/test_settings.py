"""The proxy's own settings keys: connections_max_idle_ms; quota.byte_rate_enforcement."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_quota_proxy.config import ConfigError, merge
from kafka_quota_proxy.config.quota_settings import parse_quota_section
from kafka_quota_proxy.config.settings import DEFAULT_CONNECTIONS_MAX_IDLE_MS, parse_values

UPSTREAM = {"upstream": "127.0.0.1:9092"}


def test_connections_max_idle_ms_defaults_to_kafkas_ten_minutes() -> None:
    assert DEFAULT_CONNECTIONS_MAX_IDLE_MS == 600_000
    assert merge(parse_values(UPSTREAM)).connections_max_idle_ms == 600_000


@pytest.mark.parametrize("value, expected", [(1, 1), (540_000, 540_000), (-1, None), (None, None)])
def test_connections_max_idle_ms_is_milliseconds_or_never(value: Any, expected: int | None) -> None:
    settings = merge(parse_values({**UPSTREAM, "connections_max_idle_ms": value}))
    assert settings.connections_max_idle_ms == expected


@pytest.mark.parametrize("value", [0, -2, 1.5, "600000", True, "never"])
def test_connections_max_idle_ms_refuses_anything_else(value: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_values({"connections_max_idle_ms": value})
    assert exc.value.key == "connections_max_idle_ms"
    assert "-1 or null for no idle timeout" in str(exc.value)


def test_byte_rate_enforcement_is_kafka_unless_paced_is_asked_for() -> None:
    assert parse_quota_section(None).byte_rate_enforcement == "kafka"
    assert parse_quota_section({"byte_rate_enforcement": "paced"}).byte_rate_enforcement == "paced"
    with pytest.raises(ConfigError) as exc:
        parse_quota_section({"byte_rate_enforcement": "smooth"})
    assert exc.value.key == "quota.byte_rate_enforcement"
    assert "kafka" in str(exc.value) and "paced" in str(exc.value)
