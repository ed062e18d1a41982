"""The soak's ledger of delivery errors (devkit/soak/workload.py): a batch a client fails as one
exception on every record is one failure, with its record count."""

from __future__ import annotations

from devkit.soak.workload import Ledger


def test_records_failed_by_one_exception_are_one_failure() -> None:
    ledger = Ledger()
    expired = TimeoutError("Expiring 30 record(s) for TopicPartition(topic='soak', partition=1): "
                           "120006 ms has passed since batch creation")
    for _ in range(30):  # kafka-python: one errback a record, the batch's one exception each time
        ledger.error(f"producer: {expired!r}", cause=expired)
    other = TimeoutError("Expiring 30 record(s) for TopicPartition(topic='soak', partition=1): "
                         "120006 ms has passed since batch creation")
    ledger.error(f"producer: {other!r}", cause=other)  # another batch, the same words
    ledger.error("steady: Local: Message timed out")  # librdkafka: one a record, no shared cause
    ledger.error("steady: Local: Message timed out")
    assert [f.records for f in ledger.errors] == [30, 1, 1, 1]
    assert str(ledger.errors[0]).endswith('120006 ms has passed since batch creation") (30 records)')
    assert str(ledger.errors[0]).startswith("0 s: producer: TimeoutError(")


def test_the_ledger_keeps_at_most_max_errors() -> None:
    ledger = Ledger()
    for i in range(Ledger.MAX_ERRORS + 5):
        ledger.error(f"e{i}", cause=ValueError(i))
    assert len(ledger.errors) == Ledger.MAX_ERRORS
