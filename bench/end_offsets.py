"""What a broker appended, read from its end offsets: a topic's end offsets summed over its
partitions, straight from the broker every READ_EVERY_S, times the record size. Counted at the
broker, whoever enforced the quota, and whatever the client saw of it (a request it timed out and
sent again is counted as often as the broker appended it)."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from devkit.producing import Timeline

READ_EVERY_S = 0.05  # the broker's end offsets are read this often


class EndOffsets:
    """The topic's end offsets summed over its partitions, read straight from the broker every
    READ_EVERY_S from `start` (time.monotonic) until stopped, times `record` bytes: what the
    broker appended, whoever enforced the quota. Its own client-id has no quota."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, record: int, start: float) -> None:
        self.timeline = Timeline()
        self.last: list[int] = []  # each partition's end offset at the last reading
        self._stop = threading.Event()
        self._args = (bootstrap, topic, partitions, record, start)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> EndOffsets:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        bootstrap, topic, partitions, record, start = self._args
        c = Consumer({"bootstrap.servers": bootstrap, "client.id": "fidelity-meter",
                      "group.id": "fidelity-meter", "enable.auto.commit": False})
        marks = self.timeline.marks
        at = 0.0
        try:
            while not self._stop.is_set():
                wait = start + at - time.monotonic()
                if wait > 0:
                    self._stop.wait(wait)
                elapsed = time.monotonic() - start
                try:
                    each = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=2,
                                                    cached=False)[1] for p in range(partitions)]
                except Exception:  # a slow answer: the next reading counts it
                    self.timeline.errors += 1
                else:
                    marks.append((elapsed, sum(each) * record))
                    self.last = each
                at = max(at + READ_EVERY_S, elapsed - elapsed % READ_EVERY_S)
        finally:
            c.close()
