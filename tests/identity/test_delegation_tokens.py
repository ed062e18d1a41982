"""identity/delegation_tokens.py: token id -> owner, what was missed and when, with time passed in."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.identity.delegation_tokens import RETRY_SECONDS, TokenOwners


def test_an_owner_learnt_is_known_and_never_asked_for() -> None:
    owners = TokenOwners()
    assert owners.owner("tok") is None and owners.may_ask("tok", 0.0)
    owners.learn("tok", "alice")
    assert owners.owner("tok") == "alice"
    assert not owners.may_ask("tok", 0.0) and not owners.may_ask("tok", 1e9)


def test_an_owner_is_kept_however_long_ago_it_was_learnt() -> None:
    # A token's owner never changes (a renewal keeps both), so nothing expires by time.
    owners = TokenOwners()
    owners.learn("tok", "alice")
    owners.learn("tok", "alice")
    assert owners.owner("tok") == "alice" and len(owners) == 1


def test_nameless_entries_are_not_learnt() -> None:
    owners = TokenOwners()
    owners.learn("", "alice")
    owners.learn("tok", "")
    assert len(owners) == 0


def test_a_miss_is_asked_again_after_exactly_retry_seconds() -> None:
    owners = TokenOwners(retry_seconds=30.0)
    owners.missed("tok", 100.0, "not described")
    assert not owners.may_ask("tok", 100.0)
    assert not owners.may_ask("tok", 129.999)
    assert owners.may_ask("tok", 130.0)
    assert owners.why_unknown("tok") == "not described"
    owners.missed("tok", 130.0, "the broker is unreachable")  # asked again, missed again
    assert not owners.may_ask("tok", 159.0) and owners.may_ask("tok", 160.0)
    assert owners.why_unknown("tok") == "the broker is unreachable"
    assert owners.may_ask("other", 100.0)  # a miss is per token id
    assert RETRY_SECONDS == 30.0


def test_learning_an_owner_forgets_its_miss_and_its_fallback() -> None:
    owners = TokenOwners()
    owners.missed("tok", 0.0, "not described")
    assert owners.first_fallback("tok")
    owners.learn("tok", "alice")
    assert owners.why_unknown("tok") == "not asked for"
    owners.missed("tok", 1.0, "ignored: the owner is known")
    assert owners.owner("tok") == "alice" and owners.why_unknown("tok") == "not asked for"


def test_a_fallback_is_reported_once_per_token_id() -> None:
    owners = TokenOwners()
    assert owners.first_fallback("tok")
    assert not owners.first_fallback("tok")
    assert owners.first_fallback("other")


def test_each_table_is_bounded_least_recently_used_first() -> None:
    owners = TokenOwners(capacity=2)
    owners.learn("a", "alice")
    owners.learn("b", "bob")
    assert owners.owner("a") == "alice"  # a is now the most recently used
    owners.learn("c", "carol")
    assert (owners.owner("a"), owners.owner("b"), owners.owner("c")) == ("alice", None, "carol")
    for token_id in ("x", "y", "z"):
        owners.missed(token_id, 0.0, "not described")
    assert owners.why_unknown("x") == "not asked for" and owners.why_unknown("z") == "not described"
    assert owners.first_fallback("x") and owners.first_fallback("y") and owners.first_fallback("z")
    assert owners.first_fallback("x")  # pushed out by y and z: reported again
    with pytest.raises(ValueError):
        TokenOwners(capacity=0)
