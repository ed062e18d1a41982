"""The background task that shares this replica's quota measurements through Valkey/Redis.

Every `sync_interval_ms` it writes what this replica recorded since the last sync and reads what
all replicas recorded, one script call per bucket of entities (scripts.py), plus one heartbeat,
in one round trip. The request path never waits for it: it only reads the numbers the last sync
left.

When the store fails (an error, or no answer within `timeout_ms`) twice in a row, or no sync has
succeeded for two sync intervals plus twice the usual sync's duration, at least three intervals
(a stopped or partitioned store answers nothing, and waiting for two `timeout_ms` left the
replicas on stale counts for a second), the replica is degraded: it enforces its share of each
quota (quota/shared.py), logs one line and sets the `store_degraded` gauge. After
`degraded_grace_seconds` the `on_failure` policy applies. The first sync that succeeds again
ends it; writes are absolute, so nothing is counted twice.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafka_quota_proxy.config.store_settings import StoreSettings
from kafka_quota_proxy.proxy.store import scripts
from kafka_quota_proxy.proxy.store.calls import (
    TurnCall,
    bucket_call,
    connect,
    no_script_error,
    reason_of,
    text,
    turn_calls,
    turns_answered,
)
from kafka_quota_proxy.quota.shared import SharedIds, SharedQuotas, SyncBatch, bucket_of
from kafka_quota_proxy.quota.turns import Turns

log = logging.getLogger("kafka_quota_proxy.store")


CONFIRM_S = 0.02  # how long the watchdog waits to look again before it degrades the replica


def monotonic_ms() -> float:
    return time.monotonic_ns() / 1_000_000


@dataclass
class SyncStats:
    """What the metrics show of the sync."""

    syncs: int = 0
    errors: int = 0
    last_duration_ms: float = 0.0
    last_success_ms: float | None = None  # monotonic
    entities: int = 0
    degraded: bool = False
    durations_ms: list[float] = field(default_factory=list)  # since the last scrape

    def lag_ms(self, now_ms: float) -> float | None:
        return None if self.last_success_ms is None else now_ms - self.last_success_ms


class SharedConfig(Protocol):
    """The quotas set through the API, shared through the store (proxy/quota_runtime/control.py)."""

    def take_unshared(self) -> list[tuple[str, str]]: ...

    def give_back(self, changes: list[tuple[str, str]]) -> None: ...

    def all_fields(self) -> list[tuple[str, str]]: ...

    def adopt_shared(self, fields: dict[str, str]) -> list[str]: ...


class StoreSync:
    """Keeps `shared` in step with the store. `start` connects and syncs once (a store that is
    down at start is not fatal: the replica starts degraded and keeps trying)."""

    def __init__(self, settings: StoreSettings, shared: SharedQuotas,
                 clock: Callable[[], float] = monotonic_ms, replica: str | None = None,
                 client: Any = None, config: SharedConfig | None = None,
                 id_rates: SharedQuotas | None = None, ids: SharedIds | None = None) -> None:
        self.settings = settings
        self.shared = shared
        # Each registry syncs under its own bucket kind: byte rates and mutations, producer-id rates.
        self.registries: list[tuple[str, SharedQuotas]] = [("b", shared)]
        if id_rates is not None:
            self.registries.append(("p", id_rates))
        for _, registry in self.registries:
            registry.read_every_ms = float(settings.sync_interval_ms)
        # The store keeps the paced byte rates' turns (quota/turns.py, scripts.TAKE_TURNS).
        self.turns = shared.turns = Turns(float(settings.sync_interval_ms))
        self.ids = ids
        self.config = config
        self._config_version: int | None = None  # the store's quotas version last adopted
        self.clock = clock
        self.replica = replica or secrets.token_hex(6)
        self.stats = SyncStats()
        self._client = client
        self._scripts: dict[str, Any] = {}
        self._failures = 0
        self._watchdog: asyncio.TimerHandle | None = None
        self._confirming = False  # the watchdog found the sync late once and looks again
        self._recent_ms: deque[float] = deque(maxlen=20)  # the last successful syncs' durations
        self._wrote: set[tuple[str, int]] = set()  # buckets written to (the store had them then)
        self._clock_set = False
        for _, registry in self.registries:
            registry.policy = "local_share"
        # Until the store's clock is read, this host's: counts made before the first sync then
        # land in (about) the right aligned samples rather than in samples from the epoch.
        shared.clock.offset_ms = time.time_ns() / 1_000_000 - clock()
        for _, registry in self.registries:
            registry.clock_moved()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.settings)
        return self._client

    def _script(self, name: str, text: str) -> Any:
        found = self._scripts.get(name)
        if found is None:
            found = self._scripts[name] = self.client.register_script(text)
        return found

    async def close(self) -> None:
        if self._client is not None:
            try:
                await self._client.aclose()
            except Exception:  # noqa: BLE001 - closing a broken client must not stop a shutdown
                pass

    async def run_forever(self) -> None:
        interval = self.settings.sync_interval_ms / 1000
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = time.monotonic()
                if await self.sync_once():
                    # Armed from the first success on (until then, two failed syncs degrade: a
                    # first connection may take longer than a sync does).
                    if self._watchdog is not None:
                        self._watchdog.cancel()
                    self._confirming = False
                    self._watchdog = loop.call_later(self.stale_after_ms() / 1000, self._check_stale)
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None

    @property
    def settle_ms(self) -> float:
        """How long into an aligned sample the one before is still read: three sync intervals,
        by when every replica that syncs on time has written its last bytes of it. A replica
        whose syncs failed meanwhile writes its bytes later; the others then miss them (at most
        what it counted in the intervals it was late) until the sample leaves the window."""
        return 3.0 * self.settings.sync_interval_ms

    def stale_after_ms(self) -> float:
        """How long without a successful sync degrades the replica: two sync intervals, plus twice
        the longest of the last syncs but at least one more interval (a store far away must not
        make every sync look late, nor a loaded machine a near one)."""
        # Until a second sync, the first one's (which also connected: longer, so on the safe side).
        usual = max(self._recent_ms) if self._recent_ms else self.stats.last_duration_ms
        interval = self.settings.sync_interval_ms
        return 2 * interval + max(2 * usual, interval)

    def _check_stale(self) -> None:
        """The watchdog `run_forever` arms after each successful sync: it fires while a sync that
        the store does not answer is still waiting for its `timeout_ms`."""
        now = self.clock()
        last = self.stats.last_success_ms
        if last is None:
            return
        wait_ms = self.stale_after_ms() - (now - last)
        loop = asyncio.get_running_loop()
        if wait_ms > 0:  # a clock other than the loop's (tests): look again when it is due
            self._watchdog = loop.call_later(wait_ms / 1000, self._check_stale)
        elif not self._confirming:
            # Once more a few loop turns later: when the loop itself was held up (a busy proxy),
            # the answer may be in and its sync not yet resumed, and this timer ran first.
            self._confirming = True
            self._watchdog = loop.call_later(CONFIRM_S, self._check_stale)
        elif not self.stats.degraded:
            self._degrade(now, f"had no answer for {now - last:.0f} ms")

    async def sync_once(self) -> bool:
        """One sync; True if the store answered. Never raises (but for cancellation)."""
        started = self.clock()
        try:
            async with asyncio.timeout(self.settings.timeout_ms / 1000):
                # One round trip when there is nothing else to do: the heartbeat, the quotas'
                # version and every bucket's call go together (sync_all). API changes to write
                # and producer ids to ask about take one more each, first.
                config = self.config
                if config is not None:
                    changes = config.take_unshared()
                    if changes:
                        await self._sync_config(config, changes)
                        config = None  # read back there
                if self.ids is not None and self.ids.pending:
                    # First: the ids another replica counted first are taken back here, and the
                    # counts written below are then already without them.
                    await self._sync_ids(self.ids)
                version = await self._sync_all(config is not None)
                if config is not None:
                    if version is None:  # the store has no quotas (new, or it lost them)
                        await self._sync_config(config, [])
                    else:
                        await self._adopt_config(config, version)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any store failure degrades, never crashes
            self._failed(exc)
            return False
        now = self.clock()
        self.stats.syncs += 1
        self.stats.last_duration_ms = now - started
        self.stats.durations_ms.append(now - started)
        if self.stats.syncs > 1:  # the first one connected and loaded the scripts too
            self._recent_ms.append(now - started)
        if len(self.stats.durations_ms) > 10_000:
            del self.stats.durations_ms[:5_000]
        self.stats.last_success_ms = now
        self.stats.entities = sum(len(registry) for _, registry in self.registries)
        self._failures = 0
        if self.stats.degraded:
            for _, registry in self.registries:
                registry.recover()
            self.stats.degraded = False
            log.warning("quota store %s answers again: shared quotas back in force",
                        self.settings.redacted_url)
        return True

    def _failed(self, exc: BaseException) -> None:
        self.stats.errors += 1
        self._failures += 1
        now = self.clock()
        if self._failures < 2:
            return
        if not self.stats.degraded:
            self._degrade(now, f"failed twice: {reason_of(exc)}")
            return
        since = self.shared.degraded_since
        grace_ms = self.settings.degraded_grace_seconds * 1000
        if (since is not None and now - since >= grace_ms
                and self.shared.policy != self.settings.on_failure):
            for _, registry in self.registries:
                registry.degrade(now, self.settings.on_failure)  # type: ignore[arg-type]
            log.warning("quota store still failing after %.0fs: on_failure %s applies",
                        self.settings.degraded_grace_seconds, self.settings.on_failure)

    def _degrade(self, now: float, why: str) -> None:
        self.stats.degraded = True
        for _, registry in self.registries:
            registry.degrade(now, "local_share")
        log.warning("quota store %s %s: each quota is now enforced as this replica's share of it "
                    "(of %d live replicas); after %.0fs: %s", self.settings.redacted_url, why,
                    self.shared.live_replicas, self.settings.degraded_grace_seconds,
                    self.settings.on_failure)

    def _heartbeat_call(self) -> tuple[list[str], list[Any]]:
        gone_after_ms = max(3 * self.settings.sync_interval_ms, 3000)
        return [scripts.heartbeat_key(self.settings.key_prefix)], [self.replica, gone_after_ms]

    def _apply_heartbeat(self, answer: Any, sent: float, received: float) -> None:
        if isinstance(answer, Exception):
            raise answer
        server_ms, live = answer
        for _, registry in self.registries:
            registry.live_replicas = max(1, int(live))
        # The store's clock decides the aligned samples; moved only when it drifts by 20 ms.
        offset = int(server_ms) - (sent + received) / 2
        if not self._clock_set or abs(offset - self.shared.clock.offset_ms) > 20:
            self.shared.clock.offset_ms = offset
            self._clock_set = True
            for _, registry in self.registries:
                registry.clock_moved()

    async def _sync_config(self, config: SharedConfig, changes: list[tuple[str, str]]) -> None:
        """Write this replica's API changes (`changes`, taken from `config`), then adopt the
        store's quotas if they changed. A store that has none yet (new, or it lost its data) is
        given this replica's."""
        hash_key, version_key = scripts.quota_keys(self.settings.key_prefix)
        client = self.client
        try:
            raw = await client.get(version_key)
            writes = changes
            if raw is None:
                # The store has no quotas: it is new, or it lost them since we last read them.
                writes = config.all_fields() + changes
            if writes:
                await self._script("quotas", scripts.SET_QUOTAS)(
                    keys=[hash_key, version_key], args=[x for pair in writes for x in pair])
                raw = await client.get(version_key)
        except BaseException:
            config.give_back(changes)  # written by the next sync (a write is idempotent)
            raise
        await self._adopt_config(config, int(raw) if raw is not None else 0)

    async def _adopt_config(self, config: SharedConfig, version: int) -> None:
        """The store's quotas are at `version`: read and adopt them if this replica has not."""
        if version == self._config_version:
            return
        hash_key, _ = scripts.quota_keys(self.settings.key_prefix)
        fields = {text(k): text(v) for k, v in (await self.client.hgetall(hash_key)).items()}
        skipped = config.adopt_shared(fields)
        if skipped:
            log.warning("quota store: %d quota field(s) not understood, ignored (first: %r)",
                        len(skipped), skipped[0][:120])
        self._config_version = version

    async def _sync_ids(self, ids: SharedIds) -> None:
        """Ask the store which of the ids counted here another replica had counted first, and
        take those back: an id seen through two replicas counts once."""
        taken = ids.take()
        groups: dict[int, dict[tuple[str, int], list[int]]] = {}
        for _, user, pid, window in taken:
            groups.setdefault(bucket_of(user, self.settings.effective_buckets), {}).setdefault(
                (user, window), []).append(pid)
        ttl = 2 * ids.window_ms
        seen_elsewhere: set[tuple[str, int, int]] = set()
        try:
            for bucket, by_user in groups.items():
                keys: list[str] = []
                args: list[Any] = [ttl]
                order: list[tuple[str, int, int]] = []
                for (user, window), pids in by_user.items():
                    keys += scripts.id_set_keys(self.settings.key_prefix, bucket, user, window)
                    args += [len(pids), *pids]
                    order += [(user, window, pid) for pid in pids]
                flags = await self._script("ids", scripts.SEEN_IDS)(keys=keys, args=args)
                seen_elsewhere |= {o for o, fresh in zip(order, flags, strict=True) if not int(fresh)}
        except BaseException:
            ids.give_back(taken)
            raise
        now = self.clock()
        for counter, user, pid, window in taken:
            if (user, window, pid) in seen_elsewhere:
                seen_elsewhere.discard((user, window, pid))
                counter.unrecord(user, None, 1, now)

    async def _sync_all(self, version: bool) -> int | None:
        """The heartbeat, the quotas' version (if `version`; returned, None if the store has
        none) and every bucket with work, of every registry, in one round trip: on a standalone
        server one pipeline (one connection); on a Cluster, calls side by side, each to its
        key's node (redis-py does not pipeline scripts there). The buckets are collected with
        the clock offset and replica count of the heartbeat before (they move slowly)."""
        now = self.clock()
        work = [(kind, registry, batch) for kind, registry in self.registries
                for batch in registry.collect(now, self.settle_ms)]
        calls = [self._bucket_call(kind, registry, batch) for kind, registry, batch in work]
        left, waiting = self.turns.claims(now)
        try:
            return await self._sync_calls(version, work, calls, left, waiting)
        except BaseException:
            self.turns.give_back(left)
            raise

    async def _sync_calls(self, version: bool, work: list[tuple[str, SharedQuotas, SyncBatch]],
                          calls: list[tuple[list[str], list[Any], list[tuple[str, list[int]]]]],
                          left: list[str], waiting: list[str]) -> int | None:
        beat = self._script("heartbeat", scripts.HEARTBEAT)
        beat_keys, beat_args = self._heartbeat_call()
        script = self._script("sync", scripts.SYNC_BUCKET)
        take = self._script("turns", scripts.TAKE_TURNS)
        turn_calls = self._turn_calls(left, waiting)
        _, version_key = scripts.quota_keys(self.settings.key_prefix)
        sent = self.clock()
        if self.settings.cluster:
            asked = [beat(keys=beat_keys, args=beat_args)]
            if version:
                asked.append(self.client.get(version_key))
            asked += [script(keys=keys, args=args) for keys, args, _ in calls]
            asked += [take(keys=keys, args=args) for keys, args, _ in turn_calls]
            outs = await asyncio.gather(*asked)
        else:
            # EVALSHA straight into the pipeline: redis-py's own way with scripts first asks the
            # server whether it has them (SCRIPT EXISTS), a round trip more on every sync. A
            # server without them (restarted) answers NoScriptError: loaded, then sent again
            # (absolute writes: sending them twice changes nothing).
            for attempt in (1, 2):
                async with self.client.pipeline(transaction=False) as pipe:  # reset if cancelled
                    pipe.evalsha(beat.sha, len(beat_keys), *beat_keys, *beat_args)
                    if version:
                        pipe.get(version_key)
                    for keys, args, _ in calls:
                        pipe.evalsha(script.sha, len(keys), *keys, *args)
                    for keys, args, _ in turn_calls:
                        pipe.evalsha(take.sha, len(keys), *keys, *args)
                    outs = await pipe.execute(raise_on_error=False)
                missing = no_script_error()
                if attempt == 2 or not any(isinstance(o, missing) for o in outs):
                    break
                for loaded in (beat, script, take):
                    await self.client.script_load(loaded.script)
        self._apply_heartbeat(outs[0], sent, self.clock())
        raw = None
        if version:
            raw = outs[1]
            if isinstance(raw, Exception):
                raise raw
        first = 2 if version else 1
        buckets_end = first + len(calls)
        for (kind, registry, batch), (_, _, reads), out in zip(work, calls, outs[first:buckets_end],
                                                                strict=True):
            self._apply_bucket(kind, registry, batch, reads, out)
        self._apply_turns(turn_calls, outs[buckets_end:])
        return int(raw) if raw is not None else None

    def _turn_calls(self, left: list[str], waiting: list[str]) -> list[TurnCall]:
        return turn_calls(self.settings.key_prefix, self.replica, self.shared.buckets,
                          2 * self.stale_after_ms(), left, waiting)

    def _apply_turns(self, calls: list[TurnCall], outs: list[Any]) -> None:
        self.turns.answered(*turns_answered(calls, outs))

    def _bucket_call(self, kind: str, registry: SharedQuotas,
                     batch: SyncBatch) -> tuple[list[str], list[Any], list[tuple[str, list[int]]]]:
        return bucket_call(self.settings.key_prefix, self.replica, (kind, batch.bucket) in self._wrote,
                           registry.config, kind, batch)

    def _apply_bucket(self, kind: str, registry: SharedQuotas, batch: SyncBatch,
                      reads: list[tuple[str, list[int]]], out: Any) -> None:
        if isinstance(out, Exception):
            raise out
        lost = bool(int(out[0]))
        totals: dict[str, dict[int, int]] = {}
        i = 1
        for key, wanted in reads:
            sums = totals[key] = {}
            for s in wanted:
                sums[s] = int(out[i])
                i += 1
        self._wrote.add((kind, batch.bucket))
        if lost:
            log.info("quota store lost this replica's counts in bucket %s%d: writing them again",
                     kind, batch.bucket)
        registry.applied(batch, totals, lost, self.clock())
