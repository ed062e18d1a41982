"""Entity resolution (section 4): precedence, shared-sensor tags, sticky flags, sanitized users."""

from __future__ import annotations

import pytest

from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import BUILT_IN_KEYS
from kafka_quota_proxy.quota.resolution import (
    QuotaResolver,
    QuotaStore,
    QuotaTypes,
    Resolution,
    sanitize_user,
)

P = QuotaKey.PRODUCER_BYTE_RATE
F = QuotaKey.CONSUMER_BYTE_RATE


def E(user: str | None = None, client_id: str | None = None, ip: str | None = None) -> QuotaEntity:
    return QuotaEntity(user=user, client_id=client_id, ip=ip)


# --- Sanitizer ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("alice", "alice"),
    ("a.b-c_d09", "a.b-c_d09"),
    ("ANONYMOUS", "ANONYMOUS"),
    ("a b", "a%20b"),  # URLEncoder's '+' for a space becomes %20
    ("a+b", "a%2Bb"),
    ("a*b", "a%2Ab"),  # '*' is kept by URLEncoder, then replaced
    ("a~b", "a%7Eb"),  # URLEncoder encodes '~' (Python's quote() would not)
    ("CN=alice,O=Acme", "CN%3Dalice%2CO%3DAcme"),
    ("User:bob@EXAMPLE.COM", "User%3Abob%40EXAMPLE.COM"),
    ("é", "%C3%A9"),
    ("日本", "%E6%97%A5%E6%9C%AC"),
    ("<default>", "%3Cdefault%3E"),
    ("100%", "100%25"),
    ("", ""),
    ("\ud800", "%3F"),  # a lone surrogate encodes as '?', as Java's encoder does
])
def test_sanitize_user(name: str, expected: str) -> None:
    assert sanitize_user(name) == expected


# --- QuotaStore -----------------------------------------------------------------------------

def test_store_set_get_remove_and_version() -> None:
    store = QuotaStore()
    assert store.version == 0
    store.set(E(user="alice"), P, 1000)
    assert store.version == 1
    store.set(E(user="alice"), F, 2000)
    assert store.version == 2
    store.set(E(user="alice"), F, 2000)  # same value: no change
    assert store.version == 2
    assert store.get(E(user="alice")) == {P: 1000.0, F: 2000.0}
    assert store.get(E(user="bob")) == {}
    store.remove(E(user="alice"), P)
    assert store.version == 3
    store.remove(E(user="alice"), P)  # absent: a no-op
    store.remove(E(user="bob"), P)
    assert store.version == 3
    store.remove(E(user="alice"), F)
    assert store.entries() == {}
    assert store.version == 4


def test_store_returns_copies() -> None:
    store = QuotaStore({E(client_id="app"): {P: 10.0}})
    store.get(E(client_id="app"))[P] = 99.0
    store.entries()[E(client_id="app")][P] = 99.0
    assert store.entries() == {E(client_id="app"): {P: 10.0}}


def test_store_replace() -> None:
    store = QuotaStore()
    store.set(E(user="alice"), P, 1.0)
    store.replace({E(client_id=DEFAULT): {P: 5.0}, E(ip=DEFAULT): {QuotaKey.CONNECTION_CREATION_RATE: 20.0},
                   E(user="empty"): {}})
    assert store.entries() == {E(client_id=DEFAULT): {P: 5.0},
                               E(ip=DEFAULT): {QuotaKey.CONNECTION_CREATION_RATE: 20.0}}
    assert store.version == 2
    assert store.items_for(P) == [(E(client_id=DEFAULT), 5.0)]


def test_store_flags_are_per_key_and_sticky() -> None:
    store = QuotaStore()
    assert store.quota_types_enabled(P) == QuotaTypes.NO_QUOTAS
    store.set(E(user="alice"), P, 1.0)
    store.set(E(client_id="app"), F, 1.0)
    store.set(E(user=DEFAULT, client_id=DEFAULT), P, 1.0)
    store.set(E(ip="10.0.0.1"), QuotaKey.CONNECTION_CREATION_RATE, 1.0)
    assert store.quota_types_enabled(P) == QuotaTypes.USER | QuotaTypes.USER_CLIENT_ID
    assert store.quota_types_enabled(F) == QuotaTypes.CLIENT_ID
    assert store.quota_types_enabled(QuotaKey.CONNECTION_CREATION_RATE) == QuotaTypes.NO_QUOTAS
    store.remove(E(user="alice"), P)
    store.replace({})
    assert store.quota_types_enabled(P) == QuotaTypes.USER | QuotaTypes.USER_CLIENT_ID
    assert store.quota_types_enabled(F) == QuotaTypes.CLIENT_ID


# --- Eight-level precedence -----------------------------------------------------------------

LEVELS = [
    (1, E(user="alice", client_id="app")),
    (2, E(user="alice", client_id=DEFAULT)),
    (3, E(user="alice")),
    (4, E(user=DEFAULT, client_id="app")),
    (5, E(user=DEFAULT, client_id=DEFAULT)),
    (6, E(user=DEFAULT)),
    (7, E(client_id="app")),
    (8, E(client_id=DEFAULT)),
]


def test_eight_level_precedence_first_hit_wins() -> None:
    store = QuotaStore({entity: {P: level * 100.0} for level, entity in LEVELS})
    resolver = QuotaResolver(store, P)
    # Removing levels one by one, in order, walks down the table; the tags move with it.
    expected_tags = {1: ("alice", "app"), 2: ("alice", "app"), 3: ("alice", ""), 4: ("alice", "app"),
                     5: ("alice", "app"), 6: ("alice", ""), 7: ("", "app"), 8: ("", "app")}
    for level, entity in LEVELS:
        res = resolver.resolve("alice", "app")
        assert (res.tags, res.quota) == (expected_tags[level], level * 100.0)
        store.remove(entity, P)
    assert resolver.resolve("alice", "app").quota is None


@pytest.mark.parametrize("tags, expected", [
    (("alice", "app"), 100.0),  # (u, c) checks 1, 2, 4, 5
    (("alice", "other"), 200.0),
    (("bob", "app"), 400.0),
    (("bob", "other"), 500.0),
    (("alice", ""), 300.0),  # (u, "") checks 3, 6
    (("bob", ""), 600.0),
    (("", "app"), 700.0),  # ("", c) checks 7, 8
    (("", "other"), 800.0),
    (("", ""), None),  # nothing: unlimited, defaults notwithstanding
])
def test_quota_is_looked_up_from_the_tags_alone(tags: tuple[str, str], expected: float | None) -> None:
    store = QuotaStore({entity: {P: level * 100.0} for level, entity in LEVELS})
    assert QuotaResolver(store, P).quota(tags) == expected


def test_levels_are_per_key() -> None:
    store = QuotaStore({E(user="alice"): {F: 1.0}, E(client_id=DEFAULT): {P: 2.0}})
    assert QuotaResolver(store, P).resolve("alice", "app").quota == 2.0
    assert QuotaResolver(store, F).resolve("alice", "app").quota == 1.0


# --- Tags: which sensor is shared -----------------------------------------------------------

def test_no_quota_ever_means_disabled_and_client_tags() -> None:
    resolver = QuotaResolver(QuotaStore(), P)
    assert not resolver.quotas_enabled
    assert resolver.resolve("alice", "app") == Resolution(("", "app"), None, ("Produce", "", "app"))


def test_client_id_only_quotas() -> None:
    store = QuotaStore({E(client_id="app"): {P: 10.0}, E(client_id=DEFAULT): {P: 20.0}})
    resolver = QuotaResolver(store, P)
    assert resolver.quota_types_enabled == QuotaTypes.CLIENT_ID
    assert resolver.tags("alice", "app") == ("", "app")
    assert resolver.tags("bob", "app") == ("", "app")  # shared across users
    assert resolver.resolve("bob", "app").quota == 10.0
    assert resolver.resolve("bob", "x").quota == 20.0
    # An empty or null client-id gives ("", ""): unlimited even though <default> exists.
    assert resolver.resolve("alice", "") == Resolution(("", ""), None, ("Produce", "", ""))
    assert resolver.resolve("alice", None) == Resolution(("", ""), None, ("Produce", "", ""))


def test_user_only_quotas_are_shared_by_all_clients_of_a_user() -> None:
    store = QuotaStore({E(user=DEFAULT): {P: 10.0}})
    resolver = QuotaResolver(store, P)
    assert resolver.quota_types_enabled == QuotaTypes.USER
    assert resolver.tags("alice", "a") == ("alice", "")
    assert resolver.tags("alice", "b") == ("alice", "")
    assert resolver.tags("alice", None) == ("alice", "")
    assert resolver.resolve("alice", "b").quota == 10.0
    assert resolver.resolve("", "b") == Resolution(("", ""), None, ("Produce", "", ""))


def test_user_client_quotas_only() -> None:
    store = QuotaStore({E(user=DEFAULT, client_id=DEFAULT): {P: 10.0}})
    resolver = QuotaResolver(store, P)
    assert resolver.quota_types_enabled == QuotaTypes.USER_CLIENT_ID
    assert resolver.resolve("alice", "a") == Resolution(("alice", "a"), 10.0, ("Produce", "alice", "a"))
    # No client-id: tags (u, ""), which only levels 3 and 6 serve: unlimited.
    assert resolver.resolve("alice", "") == Resolution(("alice", ""), None, ("Produce", "alice", ""))


def test_mixed_walk_goes_by_existence_of_configs() -> None:
    store = QuotaStore({
        E(user="alice", client_id="app"): {P: 1.0},
        E(user="bob", client_id=DEFAULT): {P: 2.0},
        E(user="carol"): {P: 3.0},
        E(user=DEFAULT, client_id="tool"): {P: 4.0},
        E(client_id="app"): {P: 7.0},
        E(client_id=DEFAULT): {P: 8.0},
    })
    resolver = QuotaResolver(store, P)
    assert resolver.quota_types_enabled == QuotaTypes.CLIENT_ID | QuotaTypes.USER | QuotaTypes.USER_CLIENT_ID
    cases = {
        ("alice", "app"): (("alice", "app"), 1.0),  # level 1
        ("alice", "web"): (("", "web"), 8.0),  # nothing for alice/web in 1-6: level 8
        ("bob", "web"): (("bob", "web"), 2.0),  # level 2: a sensor per client of bob
        ("carol", "app"): (("carol", ""), 3.0),  # level 3 beats the client-id quota of app
        ("dave", "tool"): (("dave", "tool"), 4.0),  # level 4
        ("dave", "app"): (("", "app"), 7.0),  # level 7, shared with every user's app
        ("dave", ""): (("", ""), None),
        # Level 2 exists for bob, so the walk stops with (bob, ""); that tag only reads levels 3
        # and 6, none of which exists: unlimited.
        ("bob", ""): (("bob", ""), None),
    }
    for (user, client), expected in cases.items():
        res = resolver.resolve(user, client)
        assert (res.tags, res.quota) == expected, (user, client)


def test_mixed_walk_with_user_defaults() -> None:
    store = QuotaStore({E(user=DEFAULT, client_id=DEFAULT): {P: 5.0}, E(user=DEFAULT): {P: 6.0}})
    resolver = QuotaResolver(store, P)
    assert resolver.resolve("alice", "app").tags == ("alice", "app")  # level 5 exists
    store.remove(E(user=DEFAULT, client_id=DEFAULT), P)
    res = resolver.resolve("alice", "app")  # now level 6: the tags change, a new sensor
    assert (res.tags, res.quota) == (("alice", ""), 6.0)


def test_flags_are_sticky_after_removal() -> None:
    store = QuotaStore()
    resolver = QuotaResolver(store, P)
    store.set(E(user="alice"), P, 10.0)
    assert resolver.tags("alice", "app") == ("alice", "")
    store.remove(E(user="alice"), P)
    # Still enabled (recording goes on), still the user layout, and no quota applies.
    assert resolver.quotas_enabled
    assert resolver.quota_types_enabled == QuotaTypes.USER
    assert resolver.resolve("alice", "app") == Resolution(("alice", ""), None, ("Produce", "alice", ""))
    # A client-id quota now makes the layout mixed for good: the walk finds no user config and
    # falls through to the client-id tags.
    store.set(E(client_id=DEFAULT), P, 20.0)
    assert resolver.quota_types_enabled == QuotaTypes.USER | QuotaTypes.CLIENT_ID
    assert resolver.resolve("alice", "app").tags == ("", "app")
    store.set(E(user="alice"), P, 30.0)
    assert resolver.resolve("alice", "app").tags == ("alice", "")
    assert resolver.resolve("bob", "app").tags == ("", "app")


def test_user_names_are_sanitized_and_client_ids_raw() -> None:
    store = QuotaStore({E(user="CN=alice,O=Acme", client_id="client@#$%"): {P: 10.0}})
    resolver = QuotaResolver(store, P)
    res = resolver.resolve("CN=alice,O=Acme", "client@#$%")
    assert res == Resolution(("CN%3Dalice%2CO%3DAcme", "client@#$%"), 10.0,
                             ("Produce", "CN%3Dalice%2CO%3DAcme", "client@#$%"))


def test_a_principal_named_default_is_not_the_default_entity() -> None:
    store = QuotaStore({E(user="alice"): {P: 10.0}, E(user=DEFAULT): {P: 20.0}})
    resolver = QuotaResolver(store, P)
    res = resolver.resolve("<default>", "app")
    assert (res.tags, res.quota) == (("%3Cdefault%3E", ""), 20.0)  # served by /users/<default>


def test_resolution_is_cached_until_the_store_changes() -> None:
    store = QuotaStore({E(client_id=DEFAULT): {P: 10.0}})
    resolver = QuotaResolver(store, P)
    first = resolver.resolve("alice", "app")
    assert resolver.resolve("alice", "app") is first
    store.set(E(client_id=DEFAULT), P, 11.0)
    second = resolver.resolve("alice", "app")
    assert second is not first
    assert second.quota == 11.0


def test_resolution_cache_is_bounded() -> None:
    store = QuotaStore({E(client_id=DEFAULT): {P: 10.0}})
    resolver = QuotaResolver(store, P, max_cached=2)
    a = resolver.resolve("u", "a")
    resolver.resolve("u", "b")
    assert resolver.resolve("u", "a") is a
    resolver.resolve("u", "c")  # the third entry clears the cache
    assert resolver.resolve("u", "a") is not a
    assert resolver.resolve("u", "a") == a


def test_sensor_keys_use_kafkas_quota_type_names() -> None:
    store = QuotaStore({E(client_id=DEFAULT): {k: 1.0 for k in BUILT_IN_KEYS}})
    names = {k: QuotaResolver(store, k).resolve("u", "c").sensor_key[0] for k in BUILT_IN_KEYS
             if k != QuotaKey.CONNECTION_CREATION_RATE}
    assert names == {P: "Produce", F: "Fetch", QuotaKey.REQUEST_PERCENTAGE: "Request",
                     QuotaKey.CONTROLLER_MUTATION_RATE: "ControllerMutation",
                     QuotaKey.PRODUCER_IDS_RATE: "ProducerIds"}  # KIP-936's proposed name


def test_ip_entities_do_not_take_part() -> None:
    store = QuotaStore({E(ip=DEFAULT): {QuotaKey.CONNECTION_CREATION_RATE: 5.0}})
    resolver = QuotaResolver(store, QuotaKey.CONNECTION_CREATION_RATE)
    assert not resolver.quotas_enabled
    assert resolver.resolve("u", "c").quota is None
