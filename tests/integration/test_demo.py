"""`kafka-quota-proxy demo` end to end: it runs, every record comes back, nothing is left running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_demo_runs_and_cleans_up() -> None:
    result = subprocess.run([sys.executable, "-m", "proxy.cli", "demo", "--seconds", "6"],
                            cwd=REPO, capture_output=True, text=True, timeout=90)
    out = result.stdout
    assert result.returncode == 0, f"exit {result.returncode}\n{out}\n{result.stderr}"

    # Not a terminal: plain progress lines, no live view.
    assert re.search(r"^\[\s*\d+\.\ds\] produced [\d,]+ ", out, re.MULTILINE), out

    m = re.search(r"produced ([\d,]+) records, consumed ([\d,]+): (MATCH|MISMATCH)", out)
    assert m, out
    produced, consumed = number(m[1]), number(m[2])
    assert produced > 0
    assert produced == consumed
    assert m[3] == "MATCH"

    # The clients were only ever told the proxy's address, never the broker's.
    broker = re.search(r"Tansu broker: pid (\d+), listening on (\S+)", out)
    told = re.search(r"clients were told: broker \d+ at (\S+)", out)
    assert broker and told, out
    assert told[1] != broker[2]

    # The broker the demo started is gone (killed and reaped, so not even a zombie).
    with pytest.raises(ProcessLookupError):
        os.kill(int(broker[1]), 0)
    assert "stopped; proxy stopped; clients closed" in out
