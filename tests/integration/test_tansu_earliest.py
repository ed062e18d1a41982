"""devkit.tansu_earliest end to end: one short round against a real Tansu. Whether Tansu's
"earliest" is past offset 0 in a round is chance (6 of 1,920 partitions beside three busy loops,
docs/reliability.md), so this checks what the tool reports, not that it finds the fault."""

from devkit.tansu_earliest import run


def test_a_round_asks_every_partition_and_reads_each_finding_from_offset_0() -> None:
    findings, asked = run(rounds=2, partitions=4, producers=3)
    assert asked == 8
    for f in findings:
        # A finding is a partition whose "earliest" is past 0 though the read from 0 starts at 0.
        assert f.earliest > 0 and f.from_zero[:1] == [0], f.line()
