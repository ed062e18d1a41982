"""The checks every config section shares: each raises ConfigError naming the key and the value."""

from __future__ import annotations

from typing import Any

from kafka_quota_proxy.config.errors import ConfigError


def whole_number(key: str, value: Any, minimum: int = 1) -> int:
    """An int (not a bool) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(key, f"expected a whole number >= {minimum}, got {value!r}")
    return value


def mapping(key: str, value: Any, what: str = "a mapping") -> dict[str, Any]:
    """A YAML mapping; `what` says what the key expects, for the message."""
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected {what}")
    return value


def file_path(key: str, value: Any, required: bool = False) -> str | None:
    """A non-empty path string; None when the key is absent and not required."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "expected a file path")
    return value


def names(key: str, value: Any) -> frozenset[str]:
    """A list of non-empty strings (principals, client-ids)."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(key, "expected a list of names")
    return frozenset(value)


def one_of(key: str, value: Any, choices: tuple[str, ...]) -> str:
    """One of a closed set of words."""
    if value not in choices:
        raise ConfigError(key, f"expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def boolean(key: str, value: Any) -> bool:
    """true or false, not a word that merely looks like one."""
    if not isinstance(value, bool):
        raise ConfigError(key, f"expected true or false, got {value!r}")
    return value
