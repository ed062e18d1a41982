"""devkit.acked_offsets end to end: one short round through the proxy, its limited producer
throttled and its backlog purged, every acknowledged record read back from Tansu where it was
acknowledged."""

from devkit.acked_offsets import PROXY_CONFIG, one_round
from devkit.processes import ProxyProcess
from devkit.tansu import Broker


def test_a_round_through_the_proxy_finds_every_acknowledged_record(
        broker: Broker, broker_node_id: int, topic_name: str) -> None:
    proxy = ProxyProcess(broker.address, broker_node_id, extra_config=PROXY_CONFIG).start()
    try:
        r = one_round(proxy.bootstrap, broker.address, topic_name, 1.5, limited=True)
    finally:
        proxy.stop()
    assert r.ok, r.line()
    # The round did what it is for: records acknowledged, and the held producer's queue (10,000
    # records, 10 MB, against a 1 MiB/s quota) purged at the end.
    assert r.acked > 0 and r.purged > 0 and r.errors == 0, r.line()
