"""Recommended quotas (no Spark): readable rounding, defaults and overrides, entities that Kafka's
precedence resolves as intended, the YAML the proxy loads and the kafka-configs commands."""

from __future__ import annotations

import pytest
import yaml

from kafka_quota_proxy.analytics.measures import BY_KEY
from kafka_quota_proxy.analytics.readable import format_bytes, round_up_2sig, round_up_bytes
from kafka_quota_proxy.analytics.recommend import (
    TenantDemand,
    TopicDemand,
    UserDemand,
    entity_mode,
    kafka_configs_command,
    nearest_rank,
    recommend,
)
from kafka_quota_proxy.config.quota_settings import parse_quota_list, validate_quota_entries
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.resolution import QuotaResolver, QuotaStore

P, F, R, M, IDS = (QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE, QuotaKey.REQUEST_PERCENTAGE,
                 QuotaKey.CONTROLLER_MUTATION_RATE, QuotaKey.PRODUCER_IDS_RATE)
PRODUCE, FETCH, REQUEST, MUTATIONS, PRODUCER_IDS = (BY_KEY[key] for key in (P, F, R, M, IDS))
KIB, MIB = 1024, 1024 * 1024


@pytest.mark.parametrize("value, expected", [
    (0.2, 1), (7.3, 8), (99, 99), (153.2, 160), (1000, 1000), (1001, 1010), (1021, 1024), (1025, 1280),
    (178_500, 180 * KIB), (1_000_000, 980 * KIB), (1_500_000, int(1.5 * MIB)), (1_572_864, int(1.5 * MIB)),
    (1_572_865, int(1.75 * MIB)), (11 * MIB + 1, 12 * MIB), (150 * MIB + 1, 160 * MIB),
])
def test_byte_rates_round_up_to_whole_readable_bytes(value: float, expected: int) -> None:
    assert round_up_bytes(value) == expected


@pytest.mark.parametrize("value, expected", [
    (0.0347, 0.035), (0.05 * 1.5, 0.075), (157, 160), (3.4, 3.4), (3.41, 3.5), (0.0016666, 0.0017),
    (9.96, 10.0), (0.1, 0.1),
])
def test_doubles_round_up_to_two_significant_digits(value: float, expected: float) -> None:
    assert round_up_2sig(value) == expected


def test_format_bytes() -> None:
    assert [format_bytes(v) for v in (512, 1536, 1572864, 3 * 1024**3, 1010 * 1024)] == [
        "512 B", "1.5 KiB", "1.5 MiB", "3 GiB", "1010 KiB"]


def test_nearest_rank_percentile() -> None:
    assert nearest_rank(list(range(1, 21)), 95) == 19
    assert nearest_rank(list(range(1, 22)), 95) == 20
    assert nearest_rank([5.0], 95) == 5.0
    assert nearest_rank(list(range(1, 101)), 50) == 50


def tenants_with_one_outlier(user_of: str = "svc") -> list[TenantDemand]:
    """20 tenants producing 100..119 KB/s at p99, and svc-99 at 1 MB/s."""
    normal = [TenantDemand(f"{user_of}-{i:02d}", f"app-{i:02d}", {"produce": 100_000.0 + 1000 * i})
              for i in range(20)]
    return [*normal, TenantDemand(f"{user_of}-99", "app-99", {"produce": 1_000_000.0})]


def test_a_default_for_everyone_and_an_override_for_the_outlier() -> None:
    recs = recommend(tenants_with_one_outlier(), [])
    # p95 of 21 p99s is the 20th: 119000 x 1.5 = 178500 -> 180 KiB; the outlier: 1.5e6 -> 1.5 MiB.
    assert recs.quotas == {
        QuotaEntity(user=DEFAULT, client_id=DEFAULT): {P: 180 * KIB},
        QuotaEntity(user="svc-99", client_id="app-99"): {P: 1.5 * MIB},
    }
    default = recs.default(PRODUCE)
    assert default is not None and default.basis == 119_000.0
    assert [o.basis for o in recs.overrides(PRODUCE)] == [1_000_000.0]
    assert recs.default(FETCH) is None  # nobody fetches: no fetch quota at all


def test_a_tenant_above_the_percentile_but_under_the_default_gets_no_override() -> None:
    tenants = [TenantDemand(f"u{i}", "c", {"produce": 100.0}) for i in range(19)]
    tenants.append(TenantDemand("u19", "c", {"produce": 140.0}))  # above p95 (100), under 100 x 1.5
    recs = recommend(tenants, [], percentile=95, headroom=1.5)
    assert recs.quotas == {QuotaEntity(user=DEFAULT, client_id=DEFAULT): {P: 150.0}}


def test_percentile_and_headroom_are_the_callers() -> None:
    recs = recommend(tenants_with_one_outlier(), [], percentile=50, headroom=2.0)
    # p50 of 21: the 11th, 110000 x 2 = 220000 -> 220 KiB; tenants above it get their p99 x 2.
    assert recs.quotas[QuotaEntity(user=DEFAULT, client_id=DEFAULT)] == {P: 220 * KIB}
    assert {e.client_id for e in recs.quotas if e.user != DEFAULT} == {"app-99"}
    with pytest.raises(ValueError):
        recommend([], [], percentile=0)
    with pytest.raises(ValueError):
        recommend([], [], headroom=0)


def test_only_anonymous_tenants_get_client_id_quotas() -> None:
    recs = recommend([TenantDemand("ANONYMOUS", f"app-{i}", {"fetch": 1000.0}) for i in range(20)]
                     + [TenantDemand("ANONYMOUS", "hog", {"fetch": 50_000.0})], [])
    # 1000 x 1.5 = 1500 -> 1.5 KiB; 50000 x 1.5 = 75000 (73.2 KiB) -> 74 KiB.
    assert recs.quotas == {QuotaEntity(client_id=DEFAULT): {F: 1536.0},
                           QuotaEntity(client_id="hog"): {F: 74 * KIB}}


def test_every_tenant_resolves_to_the_value_meant_for_it_under_kafkas_precedence() -> None:
    tenants = [TenantDemand(f"svc-{i}", "app", {"produce": 1000.0, "request": 1.0}) for i in range(15)]
    tenants += [TenantDemand("ANONYMOUS", f"anon-{i}", {"produce": 1000.0, "request": 1.0})
                for i in range(15)]
    tenants += [TenantDemand("svc-hog", "app", {"produce": 90_000.0, "request": 1.0}),
                TenantDemand("ANONYMOUS", "anon-hog", {"produce": 1000.0, "request": 30.0})]
    recs = recommend(tenants, [])
    assert entity_mode(t.user for t in tenants) == "mixed"
    # In a mixed log the anonymous override names ANONYMOUS: a client-id-only entity (level 7)
    # would lose to the <default> user + client-id (level 5).
    assert set(recs.quotas) == {QuotaEntity(user=DEFAULT, client_id=DEFAULT),
                                QuotaEntity(user="svc-hog", client_id="app"),
                                QuotaEntity(user="ANONYMOUS", client_id="anon-hog")}
    store = QuotaStore(recs.quotas)
    # Defaults: 1000 x 1.5 -> 1.5 KiB, 1.0 x 1.5 = 1.5 %; svc-hog: 135000 B/s -> 140 KiB; anon-hog: 45 %.
    expected = {("svc-hog", "app"): {P: 140 * KIB, R: 1.5},
                ("ANONYMOUS", "anon-hog"): {P: 1536.0, R: 45.0}}
    for t in tenants:
        want = expected.get((t.user, t.client_id), {P: 1536.0, R: 1.5})
        for key, value in want.items():
            assert QuotaResolver(store, key).resolve(t.user, t.client_id).quota == value, (t, key)


def test_producer_ids_are_recommended_per_authenticated_user() -> None:
    users = [UserDemand(f"svc-{i}", {"producer_ids": 0.001}) for i in range(20)] + [
        UserDemand("etl", {"producer_ids": 0.05}), UserDemand("ANONYMOUS", {"producer_ids": 0.004})]
    recs = recommend([TenantDemand("svc-0", "app", {"produce": 10.0})], users)
    assert recs.quotas[QuotaEntity(user=DEFAULT)] == {IDS: 0.0015}
    assert recs.quotas[QuotaEntity(user="etl")] == {IDS: 0.075}
    assert QuotaEntity(user="ANONYMOUS") not in recs.quotas
    assert any(n.startswith("ANONYMOUS: the producer_ids_rate default") for n in recs.notes)


def test_an_empty_client_id_cannot_get_an_override() -> None:
    tenants = [TenantDemand(f"u{i}", "c", {"produce": 100.0}) for i in range(20)]
    tenants.append(TenantDemand("u-blank", "", {"produce": 10_000.0}))
    recs = recommend(tenants, [])
    assert list(recs.quotas) == [QuotaEntity(user=DEFAULT, client_id=DEFAULT)]
    assert len(recs.notes) == 1 and "u-blank/(no client-id)" in recs.notes[0]


def all_measures() -> list[TenantDemand]:
    normal = {"produce": 1000.0, "fetch": 2000.0, "request": 0.5, "mutations": 0.01}
    tenants = [TenantDemand(f"svc-{i}", "app", normal) for i in range(20)]
    tenants += [TenantDemand("svc-hog", "app", {**normal, "fetch": 1e6, "mutations": 2.0}),
                TenantDemand("true", "007", {**normal, "request": 40.0}),
                TenantDemand("team a", "app #1", {**normal, "produce": 1e5})]
    return tenants


def test_the_yaml_is_what_the_proxy_loads() -> None:
    recs = recommend(all_measures(), [UserDemand(f"svc-{i}", {"producer_ids": 0.001}) for i in range(20)]
                     + [UserDemand("svc-hog", {"producer_ids": 0.5})])
    text = recs.to_yaml("/var/lib/usage")
    loaded = validate_quota_entries(parse_quota_list(yaml.safe_load(text)["quotas"]))
    assert loaded == recs.quotas
    # Names YAML would read as something else are quoted; `<default>` and plain names are not.
    assert '  - user: "true"\n    client-id: "007"\n' in text
    assert '  - user: team a\n    client-id: "app #1"\n' in text
    assert "  - user: <default>\n    client-id: <default>\n    producer_byte_rate: 1536  # 1.5 KiB/s;" in text
    keys = {k for values in loaded.values() for k in values}
    assert keys == {P, F, R, M, IDS}


def test_the_kafka_configs_commands() -> None:
    prefix = "kafka-configs.sh --bootstrap-server ${BOOTSTRAP:-localhost:9092} --alter"
    assert kafka_configs_command(QuotaEntity(user=DEFAULT, client_id=DEFAULT), {P: 1048576.0, R: 25.0}) == (
        f"{prefix} --entity-type users --entity-default --entity-type clients --entity-default "
        "--add-config producer_byte_rate=1048576,request_percentage=25")
    assert kafka_configs_command(QuotaEntity(user="alice", client_id="app"), {F: 2097152.0}) == (
        f"{prefix} --entity-type users --entity-name alice --entity-type clients --entity-name app "
        "--add-config consumer_byte_rate=2097152")
    assert kafka_configs_command(QuotaEntity(client_id=DEFAULT), {M: 0.5}) == (
        f"{prefix} --entity-type clients --entity-default --add-config controller_mutation_rate=0.5")
    assert kafka_configs_command(QuotaEntity(client_id="my app"), {P: 1024.0}) == (
        f"{prefix} --entity-type clients --entity-name 'my app' --add-config producer_byte_rate=1024")
    assert kafka_configs_command(QuotaEntity(user=DEFAULT), {IDS: 0.0017}) == (
        f"{prefix} --entity-type users --entity-default --add-config producer_ids_rate=0.0017")


def test_the_script_has_one_command_per_entity() -> None:
    recs = recommend(all_measures(), [UserDemand(f"svc-{i}", {"producer_ids": 0.001}) for i in range(20)])
    script = recs.to_kafka_configs()
    commands = [line for line in script.splitlines() if line.startswith("kafka-configs.sh")]
    assert script.startswith("#!/bin/sh\n")
    assert commands == [kafka_configs_command(e, v) for e, v in recs.quotas.items()]
    assert len(commands) == len(recs.quotas) == 5  # two defaults and three overridden tenants


def test_measures_name_their_quota_keys() -> None:
    assert [m.key for m in (PRODUCE, FETCH, REQUEST, MUTATIONS, PRODUCER_IDS)] == [P, F, R, M, IDS]


def hot_and_ordinary_topics() -> list[TopicDemand]:
    """20 topics written at 10..29 KB/s at p99 and read at twice that, and `clicks` at 5 MB/s
    written, held by its quota in a quarter of its intervals."""
    normal = [TopicDemand(f"t-{i:02d}", {"produce": 10_000.0 + 1000 * i, "fetch": 20_000.0 + 2000 * i})
              for i in range(20)]
    return [*normal, TopicDemand("clicks", {"produce": 5_000_000.0, "fetch": 0.0},
                                 {"produce": 0.25, "fetch": 0.0})]


def test_topics_get_a_default_and_overrides_by_the_clients_rule() -> None:
    recs = recommend([], [], percentile=95, headroom=1.5, topics=hot_and_ordinary_topics())
    # p95 of 21 topics' produce p99 is the 20th: 29 KB/s (clicks is the 21st), x 1.5.
    default = recs.default(PRODUCE, topics=True)
    assert default is not None and default.entity == QuotaEntity(topic=DEFAULT)
    assert default.value == round_up_bytes(29_000 * 1.5)
    assert [(o.entity, o.value) for o in recs.overrides(PRODUCE, topics=True)] == [
        (QuotaEntity(topic="clicks"), round_up_bytes(5_000_000 * 1.5))]
    fetch = recs.default(FETCH, topics=True)
    # clicks is not read: the p95 of the other 20 is the 19th, 56 KB/s.
    assert fetch is not None and fetch.value == round_up_bytes(56_000 * 1.5)
    assert recs.overrides(FETCH, topics=True) == []
    # Client and topic recommendations are kept apart.
    assert recs.default(PRODUCE) is None
    assert recs.notes == ["topic clicks: its producer_byte_rate quota refused bytes in 25% of its intervals; "
                          "its demand was above the p99 seen, 4.77 MiB/s"]


def test_topic_quotas_in_the_yaml_and_the_script() -> None:
    recs = recommend(tenants_with_one_outlier(), [], topics=hot_and_ordinary_topics())
    text = recs.to_yaml()
    loaded = validate_quota_entries(parse_quota_list(yaml.safe_load(text)["quotas"]))
    assert loaded == recs.quotas
    assert ("  - topic: clicks\n"
            "    producer_byte_rate: 7602176  # 7.25 MiB/s; override: p99 rate 4.77 MiB/s x 1.5") in text
    assert "# topics: the same rule over each topic's p99 interval rate, every client together." in text
    script = recs.to_kafka_configs().splitlines()
    prefix = "kafka-configs.sh --bootstrap-server ${BOOTSTRAP:-localhost:9092} --alter"
    clicks = "--entity-type topics --entity-name clicks --add-config producer_byte_rate=7602176"
    assert f"{prefix} {clicks}" in script
    # kafka-configs.sh has no default topic: a comment says where to set it.
    (default,) = [line for line in script if line.startswith("# topic <default>")]
    assert default.startswith("# topic <default>: producer_byte_rate=")
    assert not any("--entity-type topics --entity-default" in line for line in script)
