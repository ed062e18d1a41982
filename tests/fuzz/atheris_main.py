"""One fuzz target under atheris (libFuzzer), the proxy's package instrumented for coverage:

    python -m tests.fuzz.atheris_main TARGET [libFuzzer arguments: corpus dirs, -runs=N, ...]

`make fuzz` (tests/fuzz/run.py) runs every target this way. Needs the `fuzz` extra (atheris).
"""

from __future__ import annotations

import sys

import atheris

# Only the proxy's own code is instrumented: coverage then means the decoders' branches, not
# kafka-python's or the standard library's. Nothing of kafka_quota_proxy may be imported before.
assert not any(name.startswith("kafka_quota_proxy") for name in sys.modules)
with atheris.instrument_imports(include=["kafka_quota_proxy"]):
    from tests.fuzz.targets import TARGETS


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.atheris_main {{{','.join(TARGETS)}}} [libFuzzer args]")
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
