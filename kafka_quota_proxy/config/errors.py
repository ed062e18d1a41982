"""The one error type for bad configuration: it names the key and says what was wrong."""

from __future__ import annotations


class ConfigError(Exception):
    """A bad setting: names the key and, when known, the file; printed as one line, exit 2."""

    def __init__(self, key: str, message: str, source: str | None = None) -> None:
        self.key = key
        self.message = message
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}")
