"""Every response that names brokers is rewritten, refused, or left on purpose with a reason.

The list of responses that carry a host and a port comes from Kafka's message specs (the codec's:
kafka-python's and the vendored ones), not from this file: a new API, or a new version of the
vendored specs, that names hosts fails here until a stage rewrites it or a reason is written."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_quota_proxy.protocol.api_keys import REFUSED
from kafka_quota_proxy.protocol.apis import codec, message_json
from kafka_quota_proxy.protocol.rewrite import NOT_REWRITTEN
from kafka_quota_proxy.proxy.stages.broker_addresses import BrokerAddresses


def names_hosts(fields: list[dict[str, Any]]) -> list[str]:
    """The paths of the structs in `fields` that hold both a Host and a Port."""
    found = []
    for f in fields:
        inner = f.get("fields", [])
        if {"Host", "Port"} <= {g["name"] for g in inner}:
            found.append(f["name"])
        found += [f"{f['name']}.{p}" for p in names_hosts(inner)]
    return found


def responses_naming_hosts() -> dict[int, list[str]]:
    table = codec()
    return {key: paths for key in table
            if (paths := names_hosts(message_json(table[key].response.name)["fields"]))}


def test_the_scan_finds_the_known_ones() -> None:
    found = responses_naming_hosts()
    assert found[3] == ["Brokers"] and found[10] == ["Coordinators"] and found[60] == ["Brokers"]
    assert found[78] == ["NodeEndpoints"]  # ShareFetch, from the vendored specs


def test_every_response_naming_brokers_is_handled() -> None:
    unhandled = {key: paths for key, paths in responses_naming_hosts().items()
                 if key not in BrokerAddresses.api_keys | REFUSED.keys() | NOT_REWRITTEN.keys()}
    assert unhandled == {}, (f"responses that name hosts with no stage rewriting them: {unhandled}; "
                             "rewrite them (stages/broker_addresses.py), refuse the API "
                             "(api_keys.REFUSED) or say why not (rewrite.NOT_REWRITTEN)")


@pytest.mark.parametrize("key", sorted(NOT_REWRITTEN))
def test_a_response_left_as_it_is_names_hosts(key: int) -> None:
    assert key in responses_naming_hosts()
