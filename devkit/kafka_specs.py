"""Kafka's own message specs for the client APIs that kafka-python's codec lacks, vendored into
kafka_quota_proxy/protocol/kafka_specs/ from the kafka-clients jar that devkit/pom.xml resolves
(the jar carries them as common/message/*.json, the files Kafka generates its classes from, and
kafka-python vendors its own the same way). The proxy builds its codec for those APIs from them
(protocol/apis.py), so no message layout is written by hand.

    python -m devkit.kafka_specs            # write them: after a change of Kafka version in the pom
    python -m devkit.kafka_specs --check    # exit 1, naming the files, if the vendored ones differ

Only APIs a broker serves (`"listeners"` names "broker") are taken: controller-only APIs never
reach a client through a broker's listener. `valid_versions` reads every request spec's version
range from the same jar, for tests that compare the proxy's ApiVersions answer with Kafka's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path

from kafka.protocol.schemas.fields.base import BaseField

from devkit import kafka_jvm

TARGET = Path(__file__).resolve().parents[1] / "kafka_quota_proxy" / "protocol" / "kafka_specs"
_COMMENTS = re.compile(r"(?m)^\s*//.*$")


def _clients_jar() -> Path:
    lib = kafka_jvm.resolve_jars()
    (jar,) = [p for p in lib.glob("kafka-clients-*.jar")]
    return jar


def _parsed(text: str) -> dict:
    return json.loads(_COMMENTS.sub("", text))


def _messages(jar: Path) -> dict[str, str]:
    """file name -> text, for each message spec in the jar."""
    with zipfile.ZipFile(jar) as z:
        return {Path(n).name: z.read(n).decode() for n in z.namelist()
                if n.startswith("common/message/") and n.endswith(".json")}


def valid_versions(jar: Path | None = None) -> dict[int, tuple[int, int]]:
    """API key -> (lowest, highest) of its request's `validVersions`, as Kafka's jar has them
    (the highest may be a `latestVersionUnstable` one, which a broker does not advertise)."""
    out: dict[int, tuple[int, int]] = {}
    for text in _messages(jar or _clients_jar()).values():
        spec = _parsed(text)
        if spec.get("type") == "request" and spec.get("validVersions") not in (None, "none"):
            low, high = BaseField.parse_versions(spec["validVersions"])
            out[spec["apiKey"]] = (low, high)
    return out


def wanted(jar: Path) -> dict[str, str]:
    """file name -> text, for each request/response pair of a broker API kafka-python lacks."""
    from kafka_quota_proxy.protocol.apis import kafka_python_keys

    known = kafka_python_keys()
    texts = _messages(jar)
    out: dict[str, str] = {}
    for name, text in texts.items():
        spec = _parsed(text)
        if spec.get("type") != "request" or spec["apiKey"] in known:
            continue
        if spec.get("validVersions") in (None, "none") or "broker" not in spec.get("listeners", []):
            continue
        response = name.replace("Request.json", "Response.json")
        out[name], out[response] = text, texts[response]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.kafka_specs", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args(argv)
    jar = _clients_jar()
    files = wanted(jar)
    present = {f.name: f.read_text(encoding="utf-8") for f in TARGET.glob("*.json")}
    if args.check:
        differ = sorted(set(files) ^ set(present) | {n for n in files if present.get(n) != files[n]})
        if differ:
            print(f"kafka_specs: differ from {jar.name}: {', '.join(differ)}", file=sys.stderr)
            return 1
        print(f"kafka_specs: {len(files)} files equal {jar.name}'s")
        return 0
    for stale in set(present) - set(files):
        (TARGET / stale).unlink()
    for name, text in files.items():
        (TARGET / name).write_text(text, encoding="utf-8")
    (TARGET / "SOURCE").write_text(f"{jar.name}: common/message/, {len(files)} files\n", encoding="utf-8")
    print(f"kafka_specs: wrote {len(files)} files from {jar.name} into {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
