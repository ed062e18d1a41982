"""Many connections, one quota (issue 27): three librdkafka producers flat out under one client-id
through one proxy in front of Tansu, as the issue ran them (linger.ms 5, acks 1, 1 KiB records,
queue.buffering.max.kbytes 4096, librdkafka's 1 MB batches), once with Kafka's throttle
(`quota.byte_rate_enforcement: kafka`, the default) and once paced (`paced`), side by side: two
proxies, each with its own client-id and quota.

Judged over whole windows: the three 11 s windows from 12 s to 45 s (Kafka's first allowance,
10 s of quota at once, and its pay-back come before), and the fullest sliding 11 s window in
that span. `bench.many_connections_sim` gives, over issue 27's span, 1.22x the quota and a fullest
window of 1.39x for Kafka's throttle, and 0.98 and 1.05x paced. The bounds here are wider, for a
loaded 2-core machine; Kafka's mode is only checked to be held near its quota (it is Kafka's
behaviour, over it by design: docs/quotas.md, "Many connections").
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from bench.shared_accuracy import SLIDING_S, fullest_window
from devkit.processes import ProxyProcess
from devkit.tansu import Broker
from tests.support.clients import Progress, in_thread, run_producer

pytestmark = pytest.mark.integration

QUOTA = 1_000_000  # issue 27's producer_byte_rate
PRODUCERS = 3
FROM, RUN = 12.0, 45.0  # three whole 11 s windows
ISSUE_27 = {"queue.buffering.max.kbytes": 4096}  # and librdkafka's own batch.size, 1,000,000 B


def _proxy(broker: Broker, node_id: int, enforcement: str, client_id: str) -> ProxyProcess:
    return ProxyProcess(broker.address, node_id, extra_config={
        "quota": {"byte_rate_enforcement": enforcement},
        "quotas": [{"client-id": client_id, "producer_byte_rate": QUOTA}]}).start()


def test_three_producers_of_one_client_id_in_each_mode(broker: Broker, broker_node_id: int,
                                                       topic_name: str) -> None:
    modes = ("kafka", "paced")
    proxies = [_proxy(broker, broker_node_id, mode, f"bulk-{mode}") for mode in modes]
    try:
        admin = AdminClient({"bootstrap.servers": proxies[0].bootstrap})
        admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(30)
        runs = {mode: [Progress() for _ in range(PRODUCERS)] for mode in modes}
        threads = [in_thread(run_producer, p.bootstrap, topic_name, f"bulk-{mode}", RUN, progress,
                             config=ISSUE_27)
                   for mode, p in zip(modes, proxies, strict=True) for progress in runs[mode]]
        for t in threads:
            t.join(RUN + 90)
        seen = {}
        for mode in modes:
            assert [r.errors for r in runs[mode]] == [[]] * PRODUCERS, mode

            def done(t: float, mode: str = mode) -> int:
                return sum(r.bytes_at(t) for r in runs[mode])

            windows = [(done(a + SLIDING_S) - done(a)) / (QUOTA * SLIDING_S)
                       for a in (FROM, FROM + SLIDING_S, FROM + 2 * SLIDING_S)]
            fullest = fullest_window(done, FROM, RUN) / (QUOTA * SLIDING_S)
            seen[mode] = (windows, fullest)
            print(f"{mode}: whole windows {[f'{w:.3f}' for w in windows]} of the quota, "
                  f"their mean {sum(windows) / 3:.3f}, fullest 11 s {fullest:.2f}x")
        windows, fullest = seen["paced"]
        assert 0.9 <= sum(windows) / 3 <= 1.05
        assert all(0.85 <= w <= 1.15 for w in windows)
        assert fullest <= 1.25
        windows, _ = seen["kafka"]
        assert 0.8 <= sum(windows) / 3 <= 1.6
    finally:
        for p in proxies:
            p.stop()
