"""bench.request_check runs (a few calls per round here), and every request it times passes the
check it times: a refused one would time the error path."""

from __future__ import annotations

import pytest

from bench import request_check


def test_request_check_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_check, "CALLS", 200)
    rows = request_check.run()
    assert len(rows) == 8
    assert [name.rsplit(": ", 1)[1] for name, _ in rows] == ["header read", "body checked (WellFormed)"] * 4
    assert all(" µs" in value for _, value in rows)
