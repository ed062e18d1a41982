"""Fetch v16 and v17 go to the broker as v15.

The three requests are the same bytes: KIP-951 raised Fetch to v16 only to say that the client
reads `node_endpoints` (broker addresses, in the response's last tagged fields), and v17 adds a
tagged field that only followers send. A broker asked for v15 answers without node_endpoints,
and that answer is a valid v16/v17 response too: node_endpoints is a tagged field, and absent
means none. Clients then learn a moved leader from Metadata, as before KIP-951.

What it buys: no Fetch response carries a broker address, so none needs its last bytes
rewritten, and a large response can be written on to the client as it arrives (cut-through)
instead of being held whole first. Fetch carries the bulk of a cluster's bytes; holding each
response whole cost a full copy and a response's transfer time in latency (docs/performance.md has
what it measured).
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import FETCH
from kafka_quota_proxy.protocol.headers import API_VERSION_AT
from kafka_quota_proxy.protocol.primitives import INT16
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage

ASKED_AS = 15
SAME_AS_15 = frozenset({16, 17})


class FetchAsV15(RequestStage):
    """Sends Fetch v16 and v17 to the broker as v15 (the module docstring says why)."""

    api_keys = frozenset({FETCH})

    def on_request(self, ctx: RequestContext) -> Reply | None:
        if ctx.api_version in SAME_AS_15:
            ctx.forward_as(ASKED_AS)
            ctx.patch(API_VERSION_AT, INT16.pack(ASKED_AS))
        return None
