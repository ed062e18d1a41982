"""bench.many_connections_sim: N connections under one client-id on a fake clock, held by a
model of Kafka's broker and by one of the proxy, both on the proxy's own quota engine.
Deterministic for a seed, so what it shows is checked exactly here (no clock, no processes)."""

from __future__ import annotations

from statistics import mean

import pytest

from bench.many_connections_sim import LIBRDKAFKA_BATCH, Case, Outcome, measure, paced, simulate


def long_run(server: str, connections: int, kind: str = "produce", batch_bytes: int = LIBRDKAFKA_BATCH,
             seed: int = 1) -> Outcome:
    """300 s measured from 20 s on: the window's echo of the first burst averages out."""
    return simulate(server, connections, kind, batch_bytes=batch_bytes, seconds=300.0, measured_from=20.0,
                    seed=seed)


@pytest.mark.parametrize(("connections", "batch_bytes"), [(3, LIBRDKAFKA_BATCH), (10, LIBRDKAFKA_BATCH),
                                                          (10, 128 * 1024)])
def test_the_proxys_default_holds_many_connections_as_kafkas_broker_does(connections: int,
                                                                         batch_bytes: int) -> None:
    """Within issue 28's fidelity bounds of Kafka's own broker (rate 3%, fullest window 0.05x),
    over the long run and 5 seeds (one seed's fullest window moves by up to 0.09x either way);
    both over the quota, by Kafka's formula (each throttle is its own connection's, sized as if
    the others sent nothing)."""
    kafka = [long_run("kafka", connections, batch_bytes=batch_bytes, seed=s) for s in range(1, 6)]
    proxy = [long_run("proxy", connections, batch_bytes=batch_bytes, seed=s) for s in range(1, 6)]
    assert mean(p.rate for p in proxy) == pytest.approx(mean(k.rate for k in kafka), rel=0.03)
    assert mean(p.worst for p in proxy) == pytest.approx(mean(k.worst for k in kafka), abs=0.05)
    assert min(k.rate for k in kafka) > 1.05 and min(k.worst for k in kafka) > 1.2


@pytest.mark.parametrize("connections", [1, 3, 10])
def test_over_issue_27s_span_too_the_proxy_holds_its_connections_as_kafkas_broker(connections: int) -> None:
    """Over 11-55 s, where the first burst still weighs: the means of 20 seeds within the fidelity
    bounds (rate 3%, fullest window 0.05x). Reading up to 5 requests ahead of their answers
    whatever the client's rate, the proxy charged ten producers' first four requests each at
    once and gave them 3.6% more than Kafka's broker, with windows 0.06x fuller; it now reads
    one at a time once a client is over its quota by its bytes so far (ConnectionInfo.read_alone),
    and gives 0.9% more and windows 0.02x emptier."""
    seeds = range(1, 21)
    kafka = [simulate("kafka", connections, seed=s) for s in seeds]
    proxy = [simulate("proxy", connections, seed=s) for s in seeds]
    assert mean(p.rate for p in proxy) == pytest.approx(mean(k.rate for k in kafka), rel=0.03)
    assert mean(p.worst for p in proxy) == pytest.approx(mean(k.worst for k in kafka), abs=0.05)


@pytest.mark.parametrize(("replicas", "connections"), [(3, 3), (3, 10), (10, 10)])
def test_under_kafkas_throttle_a_fleet_holds_what_one_replica_holds(replicas: int, connections: int) -> None:
    """Issue 27: with the quota shared through the store, 3 and 10 replicas give the same
    producers what one replica gives them over the long run: within 1.5% of the rate, and 0.06x
    on the fullest window (means of 10 seeds; one seed's window moves by up to 0.07x). Each
    throttle is settled at the store's reads (SharedRate.owe): predicted from each replica's own
    bytes instead, 3 replicas took 10% less than one, 10 replicas 28% less. With the others'
    bytes a rate from their oldest sample's start, not from their first bytes in it (as Kafka's
    Rate), 10 replicas took 2.0% more than one (3 replicas 1.4%). Before a young stat held for a
    guess of the others' first bytes (YOUNG_READS), each replica let its clients' first
    megabytes in before it had read the others', and 3 replicas' fullest windows (in the first
    minute) were 0.12x fuller than one replica's; now -1.2% to +0.0% and -0.03x to +0.03x."""
    seeds = range(1, 11)
    one = [simulate("proxy", connections, seconds=300.0, measured_from=20.0, seed=s) for s in seeds]
    fleet = [simulate("proxy", connections, replicas=replicas, seconds=300.0, measured_from=20.0, seed=s)
             for s in seeds]
    assert mean(f.rate for f in fleet) == pytest.approx(mean(o.rate for o in one), rel=0.015)
    assert mean(f.worst for f in fleet) == pytest.approx(mean(o.worst for o in one), abs=0.06)


def test_a_consumer_group_is_held_as_kafkas_broker_holds_it() -> None:
    kafka = long_run("kafka", 3, kind="consume")
    proxy = long_run("proxy", 3, kind="consume")
    assert proxy.rate == pytest.approx(kafka.rate, rel=0.03)
    assert kafka.rate < 0.95  # a fetch is all or nothing: Kafka's formula holds it under


def test_the_same_seed_gives_the_same_run() -> None:
    assert simulate("proxy", 3, seconds=20, seed=7) == simulate("proxy", 3, seconds=20, seed=7)
    name, value = measure(Case("kafka", 3), seeds=1, seconds=20, measured_from=11)
    assert name == "produce, 3 conns, 1000 kB batches (librdkafka), Kafka"
    assert "fullest 11 s" in value


# --- quota.byte_rate_enforcement: paced ----------------------------------------------------------
# Issue 27's option: within 5% of the quota over issue 27's span (11-55 s) and no 11 s window over
# 1.2x its worth, whatever the number of connections (on one proxy, or spread over replicas
# sharing the quota through a store). The rates are of the records' value bytes, about 1% under
# the request bytes a quota counts.

@pytest.mark.parametrize("batch_bytes", [LIBRDKAFKA_BATCH, 128 * 1024])
@pytest.mark.parametrize("connections", [1, 3, 10])
def test_paced_connections_of_one_client_id_are_held_at_the_quota(connections: int, batch_bytes: int) -> None:
    for seed in (1, 2, 3):
        out = simulate("proxy", connections, enforcement="paced", batch_bytes=batch_bytes, seed=seed)
        assert 0.95 <= out.rate <= 1.05 and out.worst <= 1.2, (seed, out)


@pytest.mark.parametrize(("replicas", "connections"), [(3, 3), (3, 10), (10, 10)])
def test_paced_replicas_sharing_the_quota_hold_their_connections_at_it(replicas: int,
                                                                       connections: int) -> None:
    # 128 KiB batches (bench.shared_accuracy's); 1 MB batches spread over replicas are not held
    # as closely (docs/quotas.md): each replica decides a second of quota at a time.
    for seed in (1, 2, 3):
        out = simulate("proxy", connections, replicas=replicas, enforcement="paced", batch_bytes=128 * 1024,
                       seed=seed)
        assert 0.95 <= out.rate <= 1.05 and out.worst <= 1.2, (seed, out)


@pytest.mark.parametrize("replicas", [1, 3])
def test_paced_consumers_of_one_group_get_their_quota(replicas: int) -> None:
    """Kafka's formula holds them 8-10% under it here (a fetch is all or nothing); paced, a fetch
    comes when the quota has room for it, so none is answered empty but by a turn taken."""
    for batch in (LIBRDKAFKA_BATCH, 128 * 1024):
        out = simulate("proxy", 3, kind="consume", replicas=replicas, enforcement="paced", batch_bytes=batch)
        assert 0.95 <= out.rate <= 1.05 and out.worst <= 1.2, (batch, out)


def test_the_paced_table_takes_other_sizes() -> None:
    """`--sizes-kib`: the 1,950 KiB fetches bench.shared_accuracy's consumers made on real fleets."""
    cases = paced(connections=[3], replicas=[3], sizes=[1950 * 1024])
    assert [(c.kind, c.connections, c.replicas, c.batch_bytes) for c in cases] == [
        ("produce", 3, 3, 1950 * 1024), ("consume", 3, 3, 1950 * 1024)]
    assert {c.batch_bytes for c in paced()} == {LIBRDKAFKA_BATCH, 128 * 1024}


TWO_MB = 1950 * 1024  # the fetches bench.shared_accuracy's consumers made on real fleets


@pytest.mark.parametrize(("kind", "batch_bytes"), [
    ("produce", LIBRDKAFKA_BATCH), ("consume", LIBRDKAFKA_BATCH), ("consume", TWO_MB)])
@pytest.mark.parametrize(("replicas", "connections"), [(3, 3), (3, 10), (10, 10)])
def test_paced_replicas_take_turns_of_seconds_of_quota(kind: str, batch_bytes: int, replicas: int,
                                                       connections: int) -> None:
    """Each request one or two seconds of the quota: the store's queue lets one replica's
    clients in at a time (quota/turns.py), so an 11 s window holds what one replica would let
    in (1.04-1.08x here); with a chance of a turn each, see below."""
    for seed in (1, 2, 3):
        out = simulate("proxy", connections, kind=kind, replicas=replicas, enforcement="paced",
                       batch_bytes=batch_bytes, seed=seed)
        assert 0.95 <= out.rate <= 1.05 and out.worst <= 1.2, (seed, out)


def test_without_turns_replicas_take_two_megabyte_turns_together() -> None:
    """What the queue is for: replicas that each take their chance of a turn at each read let
    2-3 fetches of 2 MB in before they see each other's (3 replicas: 1.38-1.44x, measured on
    real fleets 1.39x), and 10 replicas muted for their guessed turn all come back at once
    (1.80x)."""
    three = [simulate("proxy", 3, kind="consume", replicas=3, enforcement="paced", batch_bytes=TWO_MB,
                      seed=seed, turns=False).worst for seed in (1, 2, 3)]
    ten = simulate("proxy", 10, kind="consume", replicas=10, enforcement="paced", batch_bytes=TWO_MB,
                   turns=False).worst
    assert max(three) > 1.35 and ten > 1.7, (three, ten)
