"""What the WellFormed stage costs a request: its body checked against its schema
(protocol.well_formed), beside reading its header, on the proxy's own code and clock.

The requests are the throughput benchmark's (bench.wire): a Produce v9 of one 1 KiB record, a
Fetch v12 of one partition, a Metadata v12 for all topics; and a Produce v9 of ten partitions,
each with a batch of ten records, where the walk has more to do. Best of five rounds.
"""

from __future__ import annotations

from functools import partial

from kafka.protocol.metadata import MetadataRequest

from bench.producer_ids import best_ns
from bench.producer_ids import produce_frame as produce_ten_partitions
from bench.wire import fetch_frame, produce_frame, record_batch
from kafka_quota_proxy.protocol.headers import frame_request, parse_request_header
from kafka_quota_proxy.protocol.well_formed import check_request
from kafka_quota_proxy.proxy.context import ConnectionInfo, RequestContext
from kafka_quota_proxy.proxy.stages.well_formed import WellFormed

CALLS = 20_000


def _metadata_frame() -> bytes:
    req = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False)
    return frame_request(req, 12, 0, "bench")


def run() -> list[tuple[str, str]]:
    frames = {
        "Produce v9, one 1 KiB record": memoryview(produce_frame("bench", 0, record_batch(1, 1024), "bench")),
        "Produce v9, ten partitions": produce_ten_partitions(1, 10),
        "Fetch v12, one partition": memoryview(fetch_frame("bench", 0, 0, 1 << 20, "bench")),
        "Metadata v12, all topics": memoryview(_metadata_frame()),
    }
    stage = WellFormed()
    conn = ConnectionInfo("127.0.0.1:40000", "node-1")
    rows: list[tuple[str, str]] = []
    for name, frame in frames.items():
        header = parse_request_header(frame)
        ctx = RequestContext(header, frame, conn)
        check_request(frame, header)  # compiled on first use, as in the proxy
        read = best_ns(partial(parse_request_header, frame), CALLS)
        checked = best_ns(partial(stage.on_request, ctx), CALLS)
        rows += [(f"{name}: header read", f"{read / 1000:.2f} µs"),
                 (f"{name}: body checked (WellFormed)",
                  f"{checked / 1000:.2f} µs ({checked / read:.2f}x the header)")]
    return rows
