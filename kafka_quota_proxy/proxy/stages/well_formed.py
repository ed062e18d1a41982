"""The first check of every request: its body parses by its schema, or the client's connection is
closed before any stage reads it and before the broker is sent it.

A broker parses each request whole and refuses one that does not parse; the proxy forwards most
requests after reading their header alone, so without this a broker would be the first to parse
them, and one that trusts a length before checking it against the bytes there are takes every
client of the proxy down with it. protocol/well_formed.py has what is checked.
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.well_formed import check_request
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage


class WellFormed(RequestStage):
    """Refuses a request whose body does not parse by its schema (a ProtocolError: the connection
    is closed and the error counted by its kind, as for a bad header)."""

    def on_request(self, ctx: RequestContext) -> Reply | None:
        check_request(ctx.frame, ctx.header)
        return None
