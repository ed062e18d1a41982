"""CredentialStore: salted credentials, the file round trip, and validation on load."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from scramp import ScramMechanism

from kafka_quota_proxy.config import atomic_file
from kafka_quota_proxy.config.credentials_file import load_credentials, save_credentials
from kafka_quota_proxy.config.errors import ConfigError
from kafka_quota_proxy.identity import credentials
from kafka_quota_proxy.identity.credentials import (
    MECHANISMS,
    PLAIN_ITERATIONS,
    SCRAM_ITERATIONS,
    CredentialError,
    CredentialStore,
    normalise_mechanisms,
)

PASSWORD = "correct horse battery staple"
FAST = 100_000  # the lowest PLAIN iteration count accepted, to keep the tests quick


def store_with(*users: str, mechanisms: tuple[str, ...] = MECHANISMS) -> CredentialStore:
    store = CredentialStore()
    for user in users:
        store.add(user, PASSWORD + user, mechanisms, plain_iterations=FAST)
    return store


def load_document(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def write_document(path: Path, document: Any) -> Path:
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def valid_document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("creds") / "users.yaml"
    save_credentials(store_with("alice"), path)
    return load_document(path)


def broken(valid: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    document = json.loads(json.dumps(valid))
    change(document)
    return document


# ---- add, queries, verify_plain ----


def test_add_enables_exactly_the_chosen_mechanisms() -> None:
    store = CredentialStore()
    assert store.add("alice", PASSWORD, plain_iterations=FAST) is True
    assert store.add("bob", PASSWORD, ["scram-sha-512"]) is True
    assert store.users() == ("alice", "bob")
    assert store.mechanisms("alice") == ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
    assert store.mechanisms("bob") == ("SCRAM-SHA-512",)
    assert store.mechanisms("carol") == ()
    assert "alice" in store and "carol" not in store and len(store) == 2


def test_add_again_replaces_the_credentials() -> None:
    store = store_with("alice")
    assert store.add("alice", "new password", ["PLAIN"], plain_iterations=FAST) is False
    assert store.mechanisms("alice") == ("PLAIN",)
    assert store.verify_plain("alice", "new password")
    assert not store.verify_plain("alice", PASSWORD + "alice")


def test_verify_plain() -> None:
    store = store_with("alice", "bob")
    assert store.verify_plain("alice", PASSWORD + "alice") is True
    assert store.verify_plain("alice", PASSWORD + "bob") is False
    assert store.verify_plain("alice", "") is False
    assert store.verify_plain("nobody", PASSWORD + "alice") is False
    assert store.verify_plain("alice", "\udc80") is False  # not encodable


def test_verify_plain_refuses_a_user_without_plain() -> None:
    store = store_with("alice", mechanisms=("SCRAM-SHA-256",))
    assert store.verify_plain("alice", PASSWORD + "alice") is False


def test_unknown_users_cost_a_full_pbkdf2_run(monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_with("alice")
    store.add("scram-only", PASSWORD, ["SCRAM-SHA-256"])
    runs: list[int] = []
    real = hashlib.pbkdf2_hmac

    def counting(name: str, password: bytes, salt: bytes, iterations: int, *args: Any) -> bytes:
        runs.append(iterations)
        return real(name, password, salt, iterations, *args)

    monkeypatch.setattr(credentials.hashlib, "pbkdf2_hmac", counting)
    assert not store.verify_plain("nobody", "x")
    assert not store.verify_plain("scram-only", PASSWORD)
    assert not store.verify_plain("alice", "wrong")
    # Unknown names cost what the store's real users cost (here the custom count, not the default).
    assert runs == [FAST, FAST, FAST]
    runs.clear()
    assert not CredentialStore().verify_plain("nobody", "x")
    assert runs == [PLAIN_ITERATIONS]


def test_default_iteration_counts() -> None:
    store = CredentialStore()
    store.add("alice", PASSWORD)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        info = store.scram_auth_info("alice", mechanism)
        assert info is not None and info[3] == SCRAM_ITERATIONS[mechanism] == 8192
    assert PLAIN_ITERATIONS == 210_000
    assert store.verify_plain("alice", PASSWORD)


def test_scram_auth_info_is_what_scramp_derives_from_the_password() -> None:
    store = store_with("alice")
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        info = store.scram_auth_info("alice", mechanism)
        assert info is not None
        salt, stored_key, server_key, iterations = info
        again = ScramMechanism(mechanism).make_auth_info(PASSWORD + "alice", iteration_count=iterations,
                                                         salt=salt)
        assert again == (salt, stored_key, server_key, iterations)
    assert store.scram_auth_info("nobody", "SCRAM-SHA-256") is None
    with pytest.raises(ValueError):
        store.scram_auth_info("alice", "PLAIN")


def test_salts_differ_between_users_with_the_same_password() -> None:
    store = CredentialStore()
    store.add("a", PASSWORD, plain_iterations=FAST)
    store.add("b", PASSWORD, plain_iterations=FAST)
    a, b = store.scram_auth_info("a", "SCRAM-SHA-256"), store.scram_auth_info("b", "SCRAM-SHA-256")
    assert a is not None and b is not None and a[0] != b[0] and a[1] != b[1]


def test_remove() -> None:
    store = store_with("alice", "bob")
    store.remove("alice")
    assert store.users() == ("bob",)
    with pytest.raises(KeyError):
        store.remove("alice")


@pytest.mark.parametrize("user", ["ünïcødé", "a,b=c", "with space", "😀", "tab\tnew\nline", "x" * 1000])
def test_user_names_are_any_non_empty_utf8_for_plain(user: str) -> None:
    store = CredentialStore()
    store.add(user, PASSWORD, ["PLAIN"], plain_iterations=FAST)
    assert store.verify_plain(user, PASSWORD)


@pytest.mark.parametrize("user", ["ünïcødé", "a,b=c", "with space", "x" * 1000])
def test_scram_user_names(user: str) -> None:
    store = CredentialStore()
    store.add(user, PASSWORD, ["SCRAM-SHA-256"])
    assert store.scram_auth_info(user, "SCRAM-SHA-256") is not None


@pytest.mark.parametrize("user", ["😀", "bell\x07", "tab\there"])
def test_scram_refuses_names_sasl_prep_prohibits(user: str) -> None:
    # scramp's server would refuse these at login (SASLprep: Unicode 3.2, no controls).
    # Kafka's own SCRAM accepts only ASCII names, so this is still the more lenient of the two.
    with pytest.raises(CredentialError) as info:
        CredentialStore().add(user, PASSWORD, ["SCRAM-SHA-512"])
    assert info.value.key == "user"


@pytest.mark.parametrize("user, mechanisms, key", [
    ("", MECHANISMS, "user"),
    ("a\x00b", MECHANISMS, "user"),
    ("\udc80", MECHANISMS, "user"),
    ("alice", (), "mechanisms"),
    ("alice", ("SCRAM-SHA-1",), "mechanisms"),
    ("alice", ("GSSAPI",), "mechanisms"),
])
def test_add_refuses_bad_users_and_mechanisms(user: str, mechanisms: tuple[str, ...], key: str) -> None:
    with pytest.raises(CredentialError) as info:
        CredentialStore().add(user, PASSWORD, mechanisms, plain_iterations=FAST)
    assert info.value.key == key


def test_a_control_character_name_may_still_use_plain() -> None:
    store = CredentialStore()
    store.add("bell\x07", PASSWORD, ["PLAIN"], plain_iterations=FAST)
    assert store.verify_plain("bell\x07", PASSWORD)


@pytest.mark.parametrize("password", ["", "\udc80"])
def test_add_refuses_empty_or_invalid_passwords(password: str) -> None:
    with pytest.raises(CredentialError) as info:
        CredentialStore().add("alice", password, plain_iterations=FAST)
    assert info.value.key == "password"


@pytest.mark.parametrize("password", ["non\u00a0breaking", "\u2163", "cafe\u0301", "tab\there"])
def test_scram_refuses_passwords_sasl_prep_would_change(password: str) -> None:
    with pytest.raises(CredentialError) as info:
        CredentialStore().add("alice", password, ["SCRAM-SHA-256"])
    assert info.value.key == "password"
    assert password not in str(info.value)
    # PLAIN compares the exact string, so the same password is fine there.
    store = CredentialStore()
    store.add("alice", password, ["PLAIN"], plain_iterations=FAST)
    assert store.verify_plain("alice", password)


def test_add_refuses_iteration_counts_out_of_range() -> None:
    with pytest.raises(CredentialError):
        CredentialStore().add("alice", PASSWORD, ["SCRAM-SHA-256"], scram_iterations=4095)
    with pytest.raises(CredentialError):
        CredentialStore().add("alice", PASSWORD, ["SCRAM-SHA-256"], scram_iterations=16385)
    with pytest.raises(CredentialError):
        CredentialStore().add("alice", PASSWORD, ["PLAIN"], plain_iterations=99_999)
    store = CredentialStore()
    store.add("alice", PASSWORD, ["SCRAM-SHA-512"], scram_iterations=4096)
    info = store.scram_auth_info("alice", "SCRAM-SHA-512")
    assert info is not None and info[3] == 4096


def test_normalise_mechanisms() -> None:
    assert normalise_mechanisms(["plain", " SCRAM-SHA-256", "PLAIN"]) == ("SCRAM-SHA-256", "PLAIN")
    assert normalise_mechanisms("PLAIN") == ("PLAIN",)


# ---- files ----


@pytest.mark.parametrize("name", ["users.yaml", "users.json"])
def test_round_trip(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    store = store_with("alice", "bob")
    store.add("carol", PASSWORD, ["PLAIN"], plain_iterations=FAST)
    save_credentials(store, path)
    loaded = load_credentials(path)
    assert loaded.users() == ("alice", "bob", "carol")
    assert loaded.mechanisms("carol") == ("PLAIN",)
    for user in ("alice", "bob"):
        assert loaded.verify_plain(user, PASSWORD + user)
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            assert loaded.scram_auth_info(user, mechanism) == store.scram_auth_info(user, mechanism)
    assert loaded.verify_plain("carol", PASSWORD)
    if name.endswith(".json"):
        assert json.loads(path.read_text())["version"] == 1


def test_file_layout(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    save_credentials(store_with("alice"), path)
    document = load_document(path)
    assert document["version"] == 1
    [entry] = document["users"]
    assert entry["name"] == "alice"
    assert list(entry["credentials"]) == ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
    scram = entry["credentials"]["SCRAM-SHA-256"]
    assert sorted(scram) == ["iterations", "salt", "server_key", "stored_key"]
    assert len(base64.b64decode(scram["stored_key"])) == 32
    plain = entry["credentials"]["PLAIN"]
    assert plain["algorithm"] == "PBKDF2-HMAC-SHA512" and plain["iterations"] == FAST
    assert len(base64.b64decode(plain["salt"])) == 16 and len(base64.b64decode(plain["hash"])) == 64


def test_the_file_has_no_clear_password(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    store = CredentialStore()
    store.add("alice", PASSWORD, plain_iterations=FAST)
    save_credentials(store, path)
    raw = path.read_bytes()
    assert PASSWORD.encode() not in raw
    assert base64.b64encode(PASSWORD.encode()) not in raw


def test_the_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    path.write_text("version: 1\nusers: []\n")
    path.chmod(0o644)
    save_credentials(store_with("alice"), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fresh = tmp_path / "new.yaml"
    save_credentials(store_with("bob"), fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_save_into_a_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        save_credentials(store_with("alice"), tmp_path / "nope" / "users.yaml")
    assert info.value.key == "credentials"


def test_save_failure_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "users.yaml"
    save_credentials(store_with("alice"), path)
    before = path.read_bytes()

    def fail(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_file.os, "replace", fail)
    with pytest.raises(ConfigError, match="No space left"):
        save_credentials(store_with("bob"), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.yaml"]


def test_an_empty_user_list_loads(tmp_path: Path) -> None:
    path = write_document(tmp_path / "users.yaml", {"version": 1, "users": []})
    assert load_credentials(path).users() == ()
    path.write_text("version: 1\n")
    assert load_credentials(path).users() == ()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_credentials(tmp_path / "absent.yaml")
    assert info.value.key == "credentials" and info.value.source == str(tmp_path / "absent.yaml")
    assert len(load_credentials(tmp_path / "absent.yaml", missing_ok=True)) == 0


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        target = document
        for step in path[:-1]:
            target = target[step]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return change


_DELETE = object()
SCRAM256 = ("users", 0, "credentials", "SCRAM-SHA-256")
PLAIN_ENTRY = ("users", 0, "credentials", "PLAIN")


@pytest.mark.parametrize("change, expected", [
    (_set(("version",), 2), "unsupported version 2"),
    (_set(("extra",), 1), "unknown top-level keys"),
    (_set(("users",), {"alice": {}}), "'users' must be a list"),
    (_set(("users", 0), "alice"), "users[0] must be a mapping"),
    (_set(("users", 0, "name"), ""), "users[0]: the user name must be a non-empty string"),
    (_set(("users", 0, "name"), 123), "users[0]: 'name' must be a string (quote it)"),
    (_set(("users", 0, "name"), _DELETE), "users[0]: 'name' must be a string"),
    (_set(("users", 0, "name"), "a\x00b"), "must not contain NUL"),
    (_set(("users", 0, "password"), "hunter2"), "users[0] ('alice'): unknown keys ['password']"),
    (_set(("users", 0, "credentials"), {}), "'credentials' must map at least one SASL mechanism"),
    (_set(("users", 0, "credentials", "GSSAPI"), {}), "unknown SASL mechanism 'GSSAPI'"),
    (_set(SCRAM256 + ("stored_key",), "not base64!"), "SCRAM-SHA-256.stored_key is not valid base64"),
    (_set(SCRAM256 + ("stored_key",), base64.b64encode(bytes(31)).decode()),
     "SCRAM-SHA-256.stored_key must be 32 bytes, got 31"),
    (_set(SCRAM256 + ("server_key",), 12), "SCRAM-SHA-256.server_key must be a base64 string"),
    (_set(SCRAM256 + ("salt",), base64.b64encode(bytes(11)).decode()), "salt must be at least 12 bytes"),
    (_set(SCRAM256 + ("iterations",), 4095), "iterations must be an integer from 4096 to 16384"),
    (_set(SCRAM256 + ("iterations",), 16385), "iterations must be an integer from 4096 to 16384"),
    (_set(SCRAM256 + ("iterations",), "8192"), "iterations must be an integer"),
    (_set(SCRAM256 + ("iterations",), True), "iterations must be an integer"),
    (_set(SCRAM256 + ("salt",), _DELETE), "SCRAM-SHA-256 is missing salt"),
    (_set(SCRAM256 + ("password",), "x"), "SCRAM-SHA-256 has unknown keys ['password']"),
    (_set(SCRAM256, "x"), "SCRAM-SHA-256 must be a mapping"),
    (_set(PLAIN_ENTRY + ("iterations",), 99_999), "PLAIN.iterations must be an integer from 100000"),
    (_set(PLAIN_ENTRY + ("algorithm",), "MD5"), "PLAIN.algorithm must be PBKDF2-HMAC-SHA512"),
    (_set(PLAIN_ENTRY + ("hash",), base64.b64encode(bytes(32)).decode()), "PLAIN.hash must be 64 bytes"),
    (lambda d: d["users"].append(d["users"][0]), "users[1] ('alice'): user 'alice' appears twice"),
])
def test_bad_entries_are_named(tmp_path: Path, valid_document: dict[str, Any],
                               change: Callable[[dict[str, Any]], None], expected: str) -> None:
    document = broken(valid_document, change)
    path = write_document(tmp_path / "users.yaml", document)
    with pytest.raises(ConfigError) as info:
        load_credentials(path)
    assert info.value.key == "credentials"
    assert info.value.source == str(path)
    assert expected in info.value.message
    # No secret material leaks into the message.
    for key in ("salt", "stored_key", "server_key"):
        value = valid_document["users"][0]["credentials"]["SCRAM-SHA-256"][key]
        assert value not in str(info.value)
    assert "hunter2" not in str(info.value)


def test_a_bad_entry_names_the_user(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    save_credentials(store_with("alice", "bob"), path)
    document = load_document(path)
    document["users"][1]["credentials"]["SCRAM-SHA-512"]["stored_key"] = "AAAA"
    write_document(path, document)
    with pytest.raises(ConfigError, match=r"users\[1\] \('bob'\): SCRAM-SHA-512.stored_key must be 64 bytes"):
        load_credentials(path)


@pytest.mark.parametrize("text, expected", [
    ("version: 1\nusers: [\n", "not valid YAML"),
    ("- just\n- a list\n", "expected a mapping"),
    ("", "expected a mapping"),
    ("version: 1\nusers:\n- name: yes\n  credentials: {}\n", "must map at least one"),
])
def test_unparseable_files(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "users.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_credentials(path)


def test_yaml_errors_do_not_quote_the_file(tmp_path: Path) -> None:
    secret = "c2VjcmV0LXN0b3JlZC1rZXktbWF0ZXJpYWw="
    path = tmp_path / "users.yaml"
    path.write_text(f"version: 1\nusers:\n- name: a\n  credentials: {{PLAIN: {{hash: {secret}: x}}}}\n")
    with pytest.raises(ConfigError) as info:
        load_credentials(path)
    assert "not valid YAML" in info.value.message and "line 4" in info.value.message
    assert secret not in str(info.value)


def test_invalid_json_file(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text('{"version": 1, "users": [}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_credentials(path)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    path.write_bytes(b"version: 1\nusers: []\n\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_credentials(path)
    if os.geteuid() != 0:  # root reads anything
        path.write_text("version: 1\n")
        path.chmod(0)
        with pytest.raises(ConfigError, match="cannot read"):
            load_credentials(path)
