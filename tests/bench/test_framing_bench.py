"""bench.framing runs (a few frames per round here) and prints every row it promises."""

from __future__ import annotations

import pytest

from bench import framing


def test_framing_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framing, "FRAMES", 50)
    monkeypatch.setattr(framing, "LARGE_FRAMES", 2)
    monkeypatch.setattr(framing, "PEAK_FRAME", 256 * 1024)
    rows = framing.run()
    assert len(rows) == 7
    assert all(name.startswith("feed: ") and value.endswith(("ns", "µs")) for name, value in rows[:5])
    assert all("x the frame" in value for _, value in rows[5:])
