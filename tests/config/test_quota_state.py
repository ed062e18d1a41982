"""The API quota layer: merge over the file's quotas, and its crash-safe JSON state file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.config.quota_state import ApiQuotaLayer, load_state, save_state
from kafka_quota_proxy.quota.admin_api import alter_client_quotas
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey

ALICE = QuotaEntity(user="alice")
ALICE_APP = QuotaEntity(user="alice", client_id="app")
DEFAULT_USER = QuotaEntity(user=DEFAULT)
DEFAULT_CLIENT = QuotaEntity(user=DEFAULT, client_id=DEFAULT)
IP = QuotaEntity(ip="2001:db8::1")
DEFAULT_IP = QuotaEntity(ip=DEFAULT)
P = QuotaKey.PRODUCER_BYTE_RATE
C = QuotaKey.CONSUMER_BYTE_RATE
R = QuotaKey.REQUEST_PERCENTAGE
CONN = QuotaKey.CONNECTION_CREATION_RATE


def sample_layer() -> ApiQuotaLayer:
    layer = ApiQuotaLayer()
    layer.apply(ALICE, P, 1_048_576.0)
    layer.apply(ALICE, C, None)
    layer.apply(ALICE_APP, R, 12.3)
    layer.apply(DEFAULT_USER, C, None)
    layer.apply(DEFAULT_CLIENT, P, 1000.0)
    layer.apply(IP, CONN, 5.0)
    layer.apply(DEFAULT_IP, CONN, None)
    layer.apply(QuotaEntity(topic="orders"), P, 2_097_152.0)
    layer.apply(QuotaEntity(topic=DEFAULT), C, None)
    return layer


# ---- apply and merge_over ----


def test_apply_keeps_a_key_in_values_or_removed_never_both() -> None:
    layer = ApiQuotaLayer()
    layer.apply(ALICE, P, 100.0)
    assert layer.values == {ALICE: {P: 100.0}} and layer.removed == {}
    layer.apply(ALICE, P, None)
    assert layer.values == {} and layer.removed == {ALICE: {P}}
    layer.apply(ALICE, P, 200.0)
    assert layer.values == {ALICE: {P: 200.0}} and layer.removed == {}


def test_merge_over_overrides_key_by_key_and_tombstones_remove() -> None:
    file_quotas = {
        ALICE: {P: 10.0, C: 20.0, R: 30.0},
        DEFAULT_USER: {C: 5.0},
        QuotaEntity(client_id="batch"): {P: 7.0},
    }
    layer = ApiQuotaLayer()
    layer.apply(ALICE, P, 11.0)  # overrides the file's value, other keys of the entity stay
    layer.apply(ALICE, C, None)  # tombstone over a file value
    layer.apply(DEFAULT_USER, C, None)  # tombstone takes the entity's only key: the entity goes
    layer.apply(ALICE_APP, R, 1.5)  # an entity only the API knows
    layer.apply(QuotaEntity(user="nobody"), P, None)  # tombstone over nothing: no effect
    assert layer.merge_over(file_quotas) == {
        ALICE: {P: 11.0, R: 30.0},
        QuotaEntity(client_id="batch"): {P: 7.0},
        ALICE_APP: {R: 1.5},
    }
    # The file's mapping is not modified.
    assert file_quotas[ALICE] == {P: 10.0, C: 20.0, R: 30.0}
    assert DEFAULT_USER in file_quotas


def test_tombstone_survives_a_file_that_sets_the_key_again() -> None:
    layer = ApiQuotaLayer()
    layer.apply(ALICE, P, None)
    assert layer.merge_over({ALICE: {P: 10.0}}) == {}
    assert layer.merge_over({ALICE: {P: 99.0, C: 1.0}}) == {ALICE: {C: 1.0}}


def test_alter_changes_feed_the_layer() -> None:
    """The intended flow: alter the effective quotas, record the changes, merge again."""
    file_quotas = {ALICE: {P: 10.0, C: 20.0}}
    layer = ApiQuotaLayer()
    result = alter_client_quotas(layer.merge_over(file_quotas), [
        ([("user", "alice")], [("producer_byte_rate", 15.0, False), ("consumer_byte_rate", 0.0, True)]),
    ], validate_only=False)
    for change in result.changes:
        layer.apply(change.entity, change.key, change.value)
    assert layer.merge_over(file_quotas) == result.quotas == {ALICE: {P: 15.0}}


# ---- save and load ----


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "quota-state.json"
    layer = sample_layer()
    save_state(path, layer)
    loaded = load_state(path)
    assert loaded == layer
    assert loaded.values == layer.values and loaded.removed == layer.removed
    # Saving what was loaded writes the same bytes: the format is deterministic.
    first = path.read_bytes()
    save_state(path, loaded)
    assert path.read_bytes() == first


def test_file_format(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    layer = ApiQuotaLayer()
    layer.apply(DEFAULT_CLIENT, P, 1000.0)
    layer.apply(DEFAULT_CLIENT, C, None)
    save_state(path, layer)
    assert json.loads(path.read_text()) == {
        "version": 1,
        "entities": [{"entity": {"user": "<default>", "client-id": "<default>"},
                      "values": {"producer_byte_rate": 1000.0},
                      "removed": ["consumer_byte_rate"]}],
    }


def test_missing_file_is_an_empty_layer(tmp_path: Path) -> None:
    assert load_state(tmp_path / "absent.json") == ApiQuotaLayer()


def test_empty_layer_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    save_state(path, ApiQuotaLayer())
    assert load_state(path) == ApiQuotaLayer()


def test_crash_before_the_rename_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    old = sample_layer()
    save_state(path, old)
    old_bytes = path.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", crash)
    newer = ApiQuotaLayer()
    newer.apply(QuotaEntity(user="bob"), P, 1.0)
    with pytest.raises(ConfigError) as info:
        save_state(path, newer)
    assert info.value.key == "quota_state"
    assert "Input/output error" in str(info.value)
    monkeypatch.undo()

    assert path.read_bytes() == old_bytes
    assert load_state(path) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp file left behind


def test_crash_while_writing_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    save_state(path, sample_layer())
    old_bytes = path.read_bytes()

    def crash(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(ConfigError, match="No space left on device"):
        save_state(path, ApiQuotaLayer())
    monkeypatch.undo()
    assert path.read_bytes() == old_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_unwritable_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        save_state(tmp_path / "no-such-dir" / "state.json", sample_layer())
    assert info.value.key == "quota_state"


@pytest.mark.parametrize(("content", "fragment"), [
    ('{"version": 1, "entities": [', "not valid JSON"),
    ("", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"version": 2, "entities": []}', "unsupported version 2"),
    ('{"version": 1}', "'entities' must be a list"),
    ('{"version": 1, "entities": [{"entity": {"group": "g"}, "values": {}}]}', "unknown entity types"),
    ('{"version": 1, "entities": [{"entity": {}, "values": {}}]}', "entity needs"),
    ('{"version": 1, "entities": [{"entity": {"user": ""}, "values": {}}]}', "non-empty string"),
    ('{"version": 1, "entities": [{"entity": {"user": "u", "ip": "1.2.3.4"}}]}', "cannot be combined"),
    ('{"version": 1, "entities": [{"entity": {"topic": "t", "client-id": "c"}}]}', "cannot be combined"),
    ('{"version": 1, "entities": [{"entity": {"user": "u"}, "values": {"bad": 1.0}}]}', "unknown quota key"),
    ('{"version": 1, "entities": [{"entity": {"user": "u"}, "values": {"producer_byte_rate": -1}}]}',
     "must be a positive number"),
    ('{"version": 1, "entities": [{"entity": {"user": "u"}, "values": {"producer_byte_rate": "1"}}]}',
     "must be a positive number"),
    ('{"version": 1, "entities": [{"entity": {"user": "u"}, "values": {"producer_byte_rate": NaN}}]}',
     "not valid JSON"),
    ('{"version": 1, "entities": [{"entity": {"user": "u"}, "values": {"producer_byte_rate": 1},'
     ' "removed": ["producer_byte_rate"]}]}', "both set and removed"),
    ('{"version": 1, "entities": [{"entity": {"user": "u"}, "removed": []},'
     ' {"entity": {"user": "u"}, "removed": []}]}', "appears twice"),
], ids=["truncated", "empty", "not-object", "version", "no-entities", "unknown-type", "empty-entity",
        "empty-name", "ip-with-user", "topic-with-client",
        "unknown-key", "negative", "string-value", "nan", "set-and-removed",
        "duplicate-entity"])
def test_corrupt_file_is_a_config_error(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_state(path)
    assert info.value.key == "quota_state"
    assert info.value.source == str(path)
    assert fragment in info.value.message, info.value.message


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ConfigError, match="cannot read the quota state"):
        load_state(path)
    directory = tmp_path / "a-directory"
    directory.mkdir()
    with pytest.raises(ConfigError, match="cannot read the quota state"):
        load_state(directory)
