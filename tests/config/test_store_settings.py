"""The `store:` section: every key, its checks, and that a password never shows."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.config import ConfigError
from kafka_quota_proxy.config.settings import merge, parse_values
from kafka_quota_proxy.config.store_settings import StoreSettings, parse_store, redact


def test_absent_means_no_store() -> None:
    assert parse_store(None) is None
    assert merge({"upstream": parse_values({"upstream": "b:9092"})["upstream"]}).store is None


def test_defaults() -> None:
    s = parse_store({"url": "redis://valkey:6379"})
    assert s == StoreSettings(url="redis://valkey:6379", cluster=False, key_prefix="kqp",
                              sync_interval_ms=100, timeout_ms=500, buckets=None,
                              on_failure="local_share", degraded_grace_seconds=30.0)


def test_every_key() -> None:
    s = parse_store({"url": "rediss://valkey:6380", "cluster": True, "key_prefix": "q1",
                     "sync_interval_ms": 50, "timeout_ms": 80, "buckets": 4, "on_failure": "closed",
                     "degraded_grace_seconds": 5, "password_env": "KQP_STORE_PASSWORD",
                     "tls_ca_file": "/etc/ca.pem"})
    assert (s.cluster, s.key_prefix, s.sync_interval_ms, s.timeout_ms, s.buckets, s.on_failure,
            s.degraded_grace_seconds, s.password_env, s.tls_ca_file) == (
        True, "q1", 50, 80, 4, "closed", 5.0, "KQP_STORE_PASSWORD", "/etc/ca.pem")


def test_buckets_default_to_one_standalone_and_sixteen_on_a_cluster() -> None:
    assert parse_store({"url": "redis://v:6379"}).effective_buckets == 1
    assert parse_store({"url": "redis://v:6379", "cluster": True}).effective_buckets == 16
    assert parse_store({"url": "redis://v:6379", "buckets": 4}).effective_buckets == 4


def test_a_unix_socket() -> None:
    assert parse_store({"url": "unix:///run/valkey.sock"}).url == "unix:///run/valkey.sock"


@pytest.mark.parametrize(("raw", "key", "words"), [
    ({}, "store.url", "required"),
    ({"url": "http://x:1"}, "store.url", "redis://"),
    ({"url": "redis://:6379"}, "store.url", "no host"),
    ({"url": "redis://h:99999"}, "store.url", "bad port"),
    ({"url": "unix://"}, "store.url", "socket's path"),
    ({"url": "redis://h:1", "sync_interval_ms": 5}, "store.sync_interval_ms", ">= 10"),
    ({"url": "redis://h:1", "on_failure": "maybe"}, "store.on_failure", "local_share, open, closed"),
    ({"url": "redis://h:1", "key_prefix": "a{b}"}, "store.key_prefix", "braces"),
    ({"url": "redis://h:1", "cluster": "yes"}, "store.cluster", "true or false"),
    ({"url": "unix:///s", "cluster": True}, "store.cluster", "over TCP"),
    ({"url": "redis://h:1", "colour": 1}, "store.colour", "unknown key"),
    ("redis://h:1", "store", "a mapping"),
])
def test_bad_values_name_the_key(raw: object, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_store(raw)
    assert caught.value.key == key
    assert words in caught.value.message


def test_the_password_is_never_printed() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_store({"url": "http://admin:s3cret@h:1"})
    assert "s3cret" not in str(caught.value)
    s = parse_store({"url": "redis://admin:s3cret@valkey:6379/0"})
    assert s.redacted_url == "redis://admin:***@valkey:6379/0"
    assert redact("redis://valkey:6379") == "redis://valkey:6379"


def test_the_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    s = parse_store({"url": "redis://valkey:6379", "password_env": "KQP_TEST_PW"})
    assert s.password() is None
    monkeypatch.setenv("KQP_TEST_PW", "pw")
    assert s.password() == "pw"


def test_scope_cluster_is_accepted() -> None:
    values = parse_values({"upstream": "b:9092", "quota": {"scope": "cluster"}})
    assert values["quota"].scope == "cluster"
