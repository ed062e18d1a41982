"""Turns: which replica's clients go next on a paced byte-rate quota shared by a fleet
(`quota.byte_rate_enforcement: paced`, docs/cluster-quotas.md "Paced byte rates").

Pure: no I/O and no clock of its own. Each replica knows the others' bytes only as of its last
read of the store, so replicas whose clients are due at once each let one request in before they
see the others'. When each request is a second or more of the quota (a 1 MB batch, a 2 MB fetch
at 1 MB/s), those requests together fill an 11 s window far over the quota: a chance draw per
read let 2-3 of 3 replicas take one turn together (1.38x in `bench.many_connections_sim`), and
10 replicas whose clients were muted for their guessed turn came back due together (1.80x).

So the store keeps a queue per quota, in the order the replicas first asked: a replica whose
client waits for the quota's pace asks for a turn at every sync (`waiting`), and lets a request in
only when its claim heads the queue as last read (`heads`). Its claim stays while its clients come
back for more; it gives the turn up once it has paid for `TURN_READS` sync intervals of the
quota and another replica waits (`crowded`), and asks again at the back. A claim its replica
stops renewing (a client gone, a replica dead) leaves the queue at the store.

The replica at the head paces its bytes at the whole quota: the others wait for their turn, so
there is nothing to guess of their bytes. A turn of at least `TURN_READS` sync intervals keeps
the hand-over (a sync to leave, a sync for the next to read it) inside the pace of the turn
before: with a turn per request, replicas of one 128 KiB consumer each got 0.55-0.61 of the quota.
"""

from __future__ import annotations

TURN_READS = 3  # a turn lasts at least this many sync intervals of the quota's pace
# A claim is renewed at each sync while a client waits (until when it was last told to), and for
# this many sync intervals after: a client back from its pace a little late keeps its place.
GRACE_READS = 2


class Turns:
    """This replica's claims on the store's queues, and what the last read said of them."""

    __slots__ = ("read_every_ms", "_waiting", "_left", "heads", "crowded", "_turn_from", "_due")

    def __init__(self, read_every_ms: float = 100.0) -> None:
        self.read_every_ms = read_every_ms
        self._waiting: dict[str, float] = {}  # key -> until when a client of this replica waits
        self._left: set[str] = set()  # claims given up since the last sync
        self.heads: set[str] = set()  # keys whose queue this replica's claim heads, as last read
        self.crowded: set[str] = set()  # keys whose queue holds another replica's claim too
        self._turn_from: dict[str, float] = {}  # key -> the paced time its turn began at
        self._due: dict[str, float] = {}  # key -> when a muted client of this replica is back

    def wait(self, key: str, until_ms: float) -> None:
        """A client of this replica waits for a turn on `key` until at least `until_ms`."""
        known = self._waiting.get(key)
        if known is None or until_ms > known:
            self._waiting[key] = until_ms

    def paid(self, key: str, start_ms: float, until_ms: float) -> None:
        """The head's request was let in, paid for from `start_ms` to `until_ms` at the quota:
        the turn ends once it has lasted `TURN_READS` sync intervals and another replica
        waits; else the claim is kept until the client is due again."""
        began = self._turn_from.setdefault(key, start_ms)
        if key in self.crowded and until_ms - began >= TURN_READS * self.read_every_ms:
            self.leave(key)
        else:
            self.wait(key, until_ms)

    def due(self, key: str, at_ms: float) -> None:
        """A client of this replica is muted until `at_ms` (Kafka's throttle of a fetch): its
        claim is made shortly before, at the sync that comes a read before `at_ms`, so that the
        claims queue in the order the clients come back, and a muted client holds no turn."""
        known = self._due.get(key)
        if known is None or at_ms < known:
            self._due[key] = at_ms

    def leave(self, key: str) -> None:
        """Give the turn up: the claim leaves the queue at the next sync, and a client that
        still waits asks again, at the back."""
        if self._waiting.pop(key, None) is not None:
            self._left.add(key)
        self.heads.discard(key)
        self._turn_from.pop(key, None)

    def claims(self, now_ms: float) -> tuple[list[str], list[str]]:
        """For the sync: (the claims to take off the store's queues, the claims to make or
        renew). A claim not renewed within `GRACE_READS` intervals of its last wait is taken off."""
        left = self._left
        self._left = set()
        lead = 1.5 * self.read_every_ms
        for key, at in list(self._due.items()):
            if at - lead <= now_ms:
                del self._due[key]
                self.wait(key, at)
                left.discard(key)
        grace = GRACE_READS * self.read_every_ms
        for key, until in list(self._waiting.items()):
            if now_ms > until + grace:
                del self._waiting[key]
                self._turn_from.pop(key, None)
                left.add(key)
        return sorted(left), sorted(self._waiting)

    def give_back(self, left: list[str]) -> None:
        """The sync that was to take `left` off the store's queues failed: the next one does."""
        self._left.update(left)

    def answered(self, heads: set[str], crowded: set[str]) -> None:
        """The store's queues as read: where this replica's claims are first, and which hold
        another replica's claim. A claim given up since is not first."""
        self.heads = {k for k in heads if k in self._waiting}
        self.crowded = crowded

    def __len__(self) -> int:
        return len(self._waiting)
