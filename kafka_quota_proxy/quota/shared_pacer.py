"""The pacer of a `SharedRate` (shared_rate.py): `Pacer` (pacer.py) at this replica's part of the
quota, its pace made again from the fleet's bytes at each of the store's reads. Pure: no I/O, no
clock of its own."""

from __future__ import annotations

import math

from kafka_quota_proxy.quota.aligned import AlignedCounts
from kafka_quota_proxy.quota.pacer import Pacer
from kafka_quota_proxy.quota.shared_rate import SharedRate


class SharedPacer(Pacer):
    """`Pacer` of a rate shared by proxy replicas: its bytes are paced at this replica's part of
    the quota (`quota_share`, `_part`), with its part of the credit, and taking the store's turns
    where it keeps them. Kept on its `SharedRate` (`of`), which hands it the store's reads (`read`)."""

    __slots__ = ("rate",)

    def __init__(self, rate: SharedRate) -> None:
        Pacer.__init__(self, rate.config)
        self.rate = rate
        rate.pacer = self

    @staticmethod
    def of(rate: SharedRate) -> SharedPacer:
        """The pacer of `rate`, made if it has none: one for as long as the shared stat lives,
        since the reads re-make its pace (a sensor expired and made again keeps the stat)."""
        pacer = rate.pacer
        return pacer if isinstance(pacer, SharedPacer) else SharedPacer(rate)

    def quota_share(self) -> float:
        """This replica's part of the fleet's bytes lately (`part`), or an even part of the live
        replicas' before the first read, or the degraded share: paced at that part of the quota,
        replicas pacing the same client at once add up to the quota, not N times it."""
        rate = self.rate
        degraded = rate.degraded
        if degraded is not None:
            return degraded.share
        if rate.part > 0:
            return rate.part
        return 1.0 / max(1, rate.home.live_replicas)

    def _credit_ms(self) -> float:
        # Every replica's clients may find the fleet idle at once: each takes its part of the
        # credit, so that together they take Kafka's first allowance once, not once each.
        return Pacer._credit_ms(self) / max(1, self.rate.home.live_replicas)

    def _part(self) -> float:
        # Until the next read, the others are taken to go on as they lately did, `ratio` bytes for
        # each of this replica's (as for Kafka's rate, `SharedRate.others_rate`): this replica's
        # own bytes are paced at its part of the quota, and the read puts the others' real bytes
        # in place of that guess (`read`). Where the store keeps turns, at the whole quota: the
        # others wait for their turn (quota/turns.py). While the store is out of reach, at its
        # share of it.
        rate = self.rate
        degraded = rate.degraded
        if degraded is not None:
            return degraded.share
        return 1.0 if rate.home.turns is not None else 1.0 / (1.0 + rate.ratio)

    def admit_wait_ms(self, now_ms: float) -> float:
        wait = self._admit_at - now_ms
        rate = self.rate
        home = rate.home
        turns = home.turns
        if turns is not None and rate.degraded is None:
            # The store keeps turns (quota/turns.py): due, the client goes when this replica's
            # claim heads the queue, else at a read. Its stat is read again if it was let go for
            # being idle while its client was muted, so that it learns the others' bytes.
            if not rate.listed:
                home.relist(rate)
            if wait <= 0 and rate.key not in turns.heads:
                wait = home.until_next_read_ms(now_ms)
            turns.wait(rate.key, now_ms + wait)
            return wait
        ratio = rate.ratio
        if wait > 0 or not ratio or rate.degraded is not None:
            return wait
        # Due, and the others' clients are taken to be due too: each replica would let one
        # request in before it sees the others' at the next read, all at once (10 replicas of a
        # 1 MB producer each took turns in step, 11 s windows of 1.65-1.8x). So one of them,
        # on average, goes now: each with the chance of its part, the others at the next read.
        if home.rng.random() < 1.0 / (1.0 + ratio):
            return wait
        return home.until_next_read_ms(now_ms)

    def pace(self, size: float, bound: float, now_ms: float) -> float:
        rate = self.rate
        rate.settles = False  # paced now: the pace counts the others' bytes (`read`)
        turns = rate.home.turns
        if turns is None or rate.degraded is not None:
            return Pacer.pace(self, size, bound, now_ms)
        at = Pacer.pace(self, size, bound, now_ms)
        # Paced at the whole quota (`_part`): these bytes were paid for from `at - paid`.
        turns.paid(rate.key, at - size * 1000.0 / bound, at)
        return at

    def read(self, totals: dict[int, int], sample_floor: int, now_ms: float) -> None:
        """The store's read of the rate (`SharedRate.set_totals`, the store in reach): the rate
        takes the others' bytes and, once the quota is known (`bound`), the pace is made again
        from them."""
        rate = self.rate
        bound = self.bound
        if bound is None:
            AlignedCounts.set_totals(rate, totals, sample_floor, now_ms)
            return
        first = rate.part < 0  # never read: `totals` holds every retained sample
        own = rate.since_read
        # The others' bytes `pace` took them to add meanwhile: none where the store keeps turns
        # (the others wait for theirs).
        guessed = 0.0 if rate.home.turns is not None else rate.ratio * own
        grew = rate._read_growth(totals, sample_floor, now_ms)
        # The pace is made again from the read on: the others' new bytes in place of the guess,
        # each sample's paced as let in when the sample ended (or now, if later), then this
        # replica's own bytes since the last read. Every replica's pace then counts the fleet's
        # bytes. Read for the first time, the others' past samples are paced from the oldest,
        # so what is older than the credit is paid for by the time that passed.
        credit = self._credit_ms()
        w, offset = rate._aligned_window, rate.clock.offset_ms
        at = -math.inf if first else self._admit_at - (own + guessed) * 1000.0 / bound
        for s in sorted(totals):
            new = grew[s]
            if new > 0:
                floor = min(now_ms, (s + 1) * w - offset) - credit
                if at < floor:
                    at = floor
                at += new * 1000.0 / bound
        if own:
            at = max(at, now_ms - credit) + own * 1000.0 / bound
        self._admit_at = at
