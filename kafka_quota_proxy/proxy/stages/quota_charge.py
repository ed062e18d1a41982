"""The request stage of the quotas: picks the managers a request is charged to, and charges what
is known before the broker sees it: Produce bytes, and the Fetch and ShareFetch max_bytes cap.
Producer ids (KIP-936) and controller mutations (KIP-599) are their own stages, before and after
this one (producer_ids.py, controller_mutations.py).

Produce bytes at arrival. A broker reads one request per connection at a time and charges
Produce bytes as it answers, so a client over quota is muted after one request. The proxy keeps
several requests in flight per connection; had it charged Produce bytes at the response, the
requests read meanwhile (up to `max_inflight_requests`, megabytes each) would all pass before
the first throttle took hold, and the client would move in bursts of several requests. Charged
at arrival, the request that goes over quota is the last one read: the connection holds
everything after it until its response has gone out and its throttle has passed. The bytes
charged are the same; they are charged a broker round trip earlier.

Charged on arrival, the requests read ahead are still charged before the broker has answered the
ones before them, where a broker would have read them only then. That changes nothing for a
client within its quota, but ten producers starting at once each had four requests charged in
their first milliseconds, and got 3.6% more than Kafka's broker gives them over issue 27's span
(`bench.many_connections_sim`). So a client over its quota, or over it by its bytes so far
(`ClientQuotaManager.over_so_far`, which does not count the young sensor's padding that lets a
first burst through), has its connection read one request at a time, as a broker does
(`ConnectionInfo.read_alone`); within it, up to `max_inflight_requests`.
"""

from __future__ import annotations

from kafka_quota_proxy.protocol.api_keys import FETCH, FETCHES, PRODUCE, SHARE_FETCH
from kafka_quota_proxy.protocol.errors import ProtocolError
from kafka_quota_proxy.protocol.fetch import read_fetch_request
from kafka_quota_proxy.protocol.primitives import INT32
from kafka_quota_proxy.protocol.share_fetch import read_share_fetch_request
from kafka_quota_proxy.proxy.context import RequestContext
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine, ScopeManagers
from kafka_quota_proxy.proxy.stages.base import Reply, RequestStage
from kafka_quota_proxy.proxy.stages.throttling import client_of, managers, throttle
from kafka_quota_proxy.quota.entities import QuotaKey

# The kinds charged here: their managers looked up in a scope's, their throttles counted.
PRODUCE_BYTES = QuotaKey.PRODUCER_BYTE_RATE
FETCH_BYTES = QuotaKey.CONSUMER_BYTE_RATE
REQUEST_TIME = QuotaKey.REQUEST_PERCENTAGE  # settled by QuotaSettle, which this hands the managers

PACED = frozenset({PRODUCE, FETCH, SHARE_FETCH})  # held for their turn when paced (`hold_ms`)


class QuotaCharge(RequestStage):
    """Picks the managers for a request and charges what is known before forwarding."""

    holds = PACED

    def __init__(self, engine: QuotaEngine) -> None:
        self.engine = engine

    def hold_ms(self, ctx: RequestContext) -> int:
        """`quota.byte_rate_enforcement: paced`: a Produce, Fetch or ShareFetch waits unread
        until its quota entity's pace lets its bytes in (`Pacer.pace`), whichever of the entity's
        connections it came on. Each connection's mute alone lets every connection of a
        throttled entity send one request more while the others are muted: with 10 producers of
        1 MB requests, 11 s windows of 1.5x in `bench.many_connections_sim`; held here, 1.05x."""
        engine = self.engine
        settings = engine.settings
        # Asked of every Produce and Fetch: Kafka's enforcement (the default) pays one look, two
        # with a store.
        if settings.mode != "enforce":
            return 0
        if settings.byte_rate_enforcement != "paced":
            return 0 if engine.shared is None else self._owed_ms(ctx)
        conn, header = ctx.conn, ctx.header
        user, client_id = conn.principal, header.client_id or ""
        charging = engine.charging(user, client_id)
        if charging is None:
            return 0
        now = charging[1]
        key = header.api_key
        if key == FETCH:
            try:
                if read_fetch_request(ctx.frame, header.body_offset, ctx.api_version).replica_id >= 0:
                    return 0  # follower fetches are exempt
            except ProtocolError:
                return 0  # for the stages to refuse (ApiVersionsGate, WellFormed)
        q = managers(ctx)
        manager = q.rates[PRODUCE_BYTES if key == PRODUCE else FETCH_BYTES]
        return manager.paced_wait_ms(user, client_id, now, conn.charge_handles, admit=True)

    def _owed_ms(self, ctx: RequestContext) -> int:
        """Kafka's enforcement, the quota shared with other replicas: a Produce waits unread
        until its connection's last Produce has paid the throttle Kafka's broker would have given
        it, knowing every replica's bytes before it, as the store's reads since have shown them
        (`SharedRate.owe`). With none owed, 0."""
        if ctx.header.api_key != PRODUCE:
            return 0
        conn = ctx.conn
        charging = self.engine.charging(conn.principal, ctx.header.client_id or "")
        if charging is None:
            return 0
        return managers(ctx).rates[PRODUCE_BYTES].owed_wait_ms(conn.charge_handles, charging[1])

    def on_request(self, ctx: RequestContext) -> Reply | None:
        engine = self.engine
        conn, header = ctx.conn, ctx.header
        user, client_id = conn.principal, header.client_id or ""
        charging = engine.charging(user, client_id)
        if charging is None:
            return None
        switches, now = charging
        q = managers(ctx)
        key = header.api_key
        if key == FETCH:
            info = read_fetch_request(ctx.frame, header.body_offset, ctx.api_version)
            if info.replica_id >= 0:
                return None  # follower fetches are exempt, as on a broker
            ctx.fetch_max_wait_ms = info.max_wait_ms
            if switches.enforcing and info.max_bytes_at is not None and info.max_bytes is not None:
                self._cap_max_bytes(ctx, q, info.max_bytes_at, info.max_bytes)
        elif key == SHARE_FETCH:
            # Kafka caps a ShareFetch's max_bytes as a Fetch's (KafkaApis
            # handleFetchFromShareFetchRequest, maxQuotaWindowBytes) and charges its response.
            share = read_share_fetch_request(ctx.frame, header.body_offset)
            ctx.fetch_max_wait_ms = share.max_wait_ms
            if switches.enforcing:
                self._cap_max_bytes(ctx, q, share.max_bytes_at, share.max_bytes)
        if key in FETCHES or REQUEST_TIME in switches.enabled:
            ctx.charge().managers = q  # QuotaSettle has the response to charge: fetched bytes, request time
        if key == PRODUCE:
            # Charged on arrival: the connection then reads nothing more from a client over its
            # quota until the throttle is over (see the module docstring). What goes on to the
            # broker: a topic quota may have cut refused topics out. Over its quota, or by its
            # bytes so far, the connection reads one request at a time, as a broker does (see
            # the module docstring); paced, the requests wait for their turns instead.
            throttle_ms, over = q.rates[PRODUCE_BYTES].charge(
                user, client_id, ctx.forward_size - 4, now, conn.charge_handles, switches.paced)
            if throttle_ms:
                throttle(engine, ctx, PRODUCE_BYTES, throttle_ms, now)
            conn.read_alone = over
        return None

    def _cap_max_bytes(self, ctx: RequestContext, q: ScopeManagers, at: int, max_bytes: int) -> None:
        user, client_id = client_of(ctx)
        cap = self._fetch_cap(q, user, client_id)
        if cap < max_bytes:
            ctx.patch(at, INT32.pack(max(int(cap), 1)))

    def _fetch_cap(self, q: ScopeManagers, user: str, client_id: str) -> float:
        """Kafka caps max_bytes at Q*(N-1)*W (getMaxValueInQuotaWindow). The proxy caps at one
        sample's worth, Q*W, a tenth of that by default, so that one response never holds more
        than a second of quota. With Kafka's cap, Tansu (which sizes responses by max_bytes
        and ignores max.partition.fetch.bytes) answered 6 MB at a time to a 1 MiB/s consumer:
        one delivery fitted per window and the consumer averaged a fraction of its quota."""
        fetch = q.rates[FETCH_BYTES]
        window_max = fetch.max_value_in_quota_window(user, client_id)
        quota = fetch.quota(user, client_id)
        if quota is None:
            return float(window_max)
        return min(window_max, quota * self.engine.config.window_ms / 1000)
