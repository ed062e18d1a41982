"""The readers that judge loss start at offset 0, not at the broker's "earliest".

Tansu answers ListOffsets(earliest) with the batch it stored first, not the lowest offset
(devkit.tansu.FIRST_OFFSET; `python -m devkit.tansu_earliest` reproduces it): when two
connections' first batches to a partition are stored out of order, a reader assigned
OFFSET_BEGINNING starts past records the log holds. That made `make demo` in CI report 18
acknowledged records at offsets 0-17 of one partition as the broker's loss. Each reader is run
here against a stand-in consumer that records what it was assigned."""

from __future__ import annotations

import confluent_kafka
import pytest

import devkit.acked_offsets
from devkit.demo import clients, diagnosis
from devkit.soak import workload
from devkit.tansu import FIRST_OFFSET


class Recorder:
    """A consumer that records its assignments and has nothing to read."""

    made: list[Recorder] = []

    def __init__(self, config: dict | None = None) -> None:
        self.assigned: list[tuple[str, int, int]] = []
        Recorder.made.append(self)

    def assign(self, partitions: list[confluent_kafka.TopicPartition]) -> None:
        self.assigned += [(tp.topic, tp.partition, tp.offset) for tp in partitions]

    def consume(self, num_messages: int = 1, timeout: float = 0.0) -> list:
        return []

    def unassign(self) -> None:
        pass

    def assignment(self) -> list:
        return []

    def position(self, partitions: list) -> list:
        return []

    def close(self) -> None:
        pass


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> type[Recorder]:
    Recorder.made = []
    monkeypatch.setattr(confluent_kafka, "Consumer", Recorder)
    monkeypatch.setattr(devkit.acked_offsets, "Consumer", Recorder)
    return Recorder


def assigned(recorder: type[Recorder]) -> list[tuple[str, int, int]]:
    return [a for c in recorder.made for a in c.assigned]


def test_first_offset_is_where_a_fresh_log_starts_not_offset_beginning() -> None:
    assert FIRST_OFFSET == 0 != confluent_kafka.OFFSET_BEGINNING


def test_the_demos_read_back_starts_at_offset_0(recorder: type[Recorder]) -> None:
    clients.read_back("127.0.0.1:1", "t", 3, seconds=0.05)
    assert assigned(recorder) == [("t", 0, 0), ("t", 1, 0), ("t", 2, 0)]


def test_the_demos_live_consumer_starts_at_offset_0(recorder: type[Recorder]) -> None:
    c = Recorder()
    reader = clients.SampleConsumer(c, "t", 2)
    reader.halt.set()
    reader.run()
    assert c.assigned == [("t", 0, 0), ("t", 1, 0)]


def test_the_demos_lookup_on_the_broker_starts_at_offset_0(recorder: type[Recorder]) -> None:
    # key 7 acknowledged at partition 1, offset 5: the partition is read from 0, not from 5 or
    # from the broker's "earliest"
    diagnosis.look_up("127.0.0.1:1", "t", {7: (1, 5)}, [7], seconds=0.05)
    assert assigned(recorder) == [("t", 1, 0)]


def test_acked_offsets_reads_from_offset_0(recorder: type[Recorder], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devkit.acked_offsets, "READ_SECONDS", 0.05)
    devkit.acked_offsets.read_all("127.0.0.1:1", "t", {p: 1 for p in range(devkit.acked_offsets.PARTITIONS)})
    assert assigned(recorder) == [("t", p, 0) for p in range(devkit.acked_offsets.PARTITIONS)]


def test_the_soaks_read_back_starts_at_offset_0(recorder: type[Recorder]) -> None:
    workload.read_back("127.0.0.1:1", "t", 2, idle_seconds=0.05)
    assert assigned(recorder) == [("t", 0, 0), ("t", 1, 0)]
