"""The API keys and versions the proxy's codec understands, from Kafka's own message JSON.

kafka-python generates its message classes from Kafka's message JSON; for the client APIs it lacks
(KIP-848 consumer groups, KIP-932 share groups, KIP-714 telemetry, delegation tokens, KIP-1071
streams groups ...) the same JSON, vendored from Kafka's kafka-clients jar in kafka_specs/, makes
classes the same way. So the version ranges and flexible-version boundaries here are Kafka's. The
proxy forwards any version from 0 up to the schema's maximum: for an opaque frame it needs only
the header, whose layout depends on whether the version is flexible, and that boundary is in the
schema.
"""

from __future__ import annotations

import importlib
import importlib.resources
import pkgutil
import types
from dataclasses import dataclass
from functools import cache
from typing import Any

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas import load_json

from kafka_quota_proxy.protocol import kafka_specs
from kafka_quota_proxy.protocol.api_keys import API_VERSIONS, REFUSED
from kafka_quota_proxy.protocol.errors import UnknownApiKey, UnsupportedApiVersion


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One API key as the codec knows it."""

    api_key: int
    name: str
    max_version: int
    flexible_from: int | None
    request: Any
    response: Any

    def is_flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from

    def request_header_version(self, version: int) -> int:
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersions responses always use header v0 so that a client that sent a version the
        # broker does not know can still read the error (KIP-511).
        if self.api_key == API_VERSIONS:
            return 0
        return 1 if self.is_flexible(version) else 0


def _message_classes() -> dict[tuple[int, str], Any]:
    found: dict[tuple[int, str], Any] = {}
    modules = ["kafka.protocol.sasl"]
    for group in ("metadata", "admin", "consumer", "producer"):
        pkg = importlib.import_module(f"kafka.protocol.{group}")
        modules += [f"kafka.protocol.{group}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    for name in modules:
        mod = importlib.import_module(name)
        for obj in vars(mod).values():
            if not (isinstance(obj, type) and issubclass(obj, ApiMessage)):
                continue
            cls: Any = obj
            if getattr(cls, "_json", None) is not None and "apiKey" in cls._json:
                found[(cls.API_KEY, cls.type)] = cls
    return found


def _vendored_classes() -> dict[tuple[int, str], Any]:
    """Classes for the vendored specs, made by kafka-python's machinery from Kafka's JSON."""
    found: dict[tuple[int, str], Any] = {}
    for path in importlib.resources.files(kafka_specs).iterdir():
        if path.name.endswith(".json"):
            cls: Any = types.new_class(path.name.removesuffix(".json"), (ApiMessage,),
                                       {"load_json": kafka_specs})
            found[(cls.API_KEY, cls.type)] = cls
    return found


@cache
def kafka_python_keys() -> frozenset[int]:
    """The API keys kafka-python's own codec has (the vendored specs are the others)."""
    return frozenset(key for key, kind in _message_classes() if kind == "request")


@cache
def message_json(name: str) -> dict[str, Any]:
    """A message's spec ("FetchResponse"): kafka-python's, else the vendored one."""
    try:
        return dict(load_json(name))
    except FileNotFoundError:
        return dict(load_json(name, package=kafka_specs))


@cache
def codec() -> dict[int, ApiSpec]:
    """API key -> ApiSpec for every key with both a request and a response schema."""
    classes = {**_vendored_classes(), **_message_classes()}
    table: dict[int, ApiSpec] = {}
    for (key, kind), req in classes.items():
        if kind != "request" or (key, "response") not in classes:
            continue
        resp = classes[(key, "response")]
        flex = req._flexible_versions
        flexible_from = None if flex is None or flex[0] < 0 else flex[0]
        name = req.name.removesuffix("Request")
        table[key] = ApiSpec(key, name, req.max_version, flexible_from, req, resp)
    return table


def spec_for(api_key: int, api_version: int) -> ApiSpec:
    """The spec for a request's key and version, or a typed error if the codec cannot frame it."""
    spec = codec().get(api_key)
    if spec is None:
        raise UnknownApiKey(f"unknown API key {api_key}")
    if api_key in REFUSED:
        raise UnknownApiKey(f"{spec.name} is refused by the proxy ({REFUSED[api_key]})")
    if not 0 <= api_version <= spec.max_version:
        raise UnsupportedApiVersion(
            f"{spec.name} v{api_version} is not supported (0..{spec.max_version})"
        )
    return spec


def api_name(api_key: int) -> str:
    spec = codec().get(api_key)
    return spec.name if spec is not None else f"Unknown{api_key}"
