"""The docs stay true: every relative link resolves, and every proxy config example passes check-config.

Fast and offline. A ```yaml block is a proxy config unless it has a top-level `apiVersion`,
`kind` or `services` key (Kubernetes, compose). Partial examples (a `quota:` section alone) are
completed with an `upstream:`, and an `upstream_sasl.password_file` that does not exist is
pointed at a temporary file, because check-config reads it; nothing else is changed.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.quota.kinds import QuotaKind, kinds

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
YAML_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_PROXY_CONFIG = {"apiVersion", "kind", "services"}

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(?<!\\)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_YAML_BLOCK = re.compile(r"^```yaml[^\n]*\n(.*?)^```", re.M | re.S)


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> list[str]:
    targets = []
    for line in _prose(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # a link inside inline code is not a link
        targets += _LINK.findall(line)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, mailto: ...


def test_slug_follows_github() -> None:
    assert slug("Identity: who is calling") == "identity-who-is-calling"
    assert slug("Producer-id quotas (KIP-936)") == "producer-id-quotas-kip-936"
    assert slug("The `quota:` section and the `quotas:` list") == "the-quota-section-and-the-quotas-list"
    assert slug("The record, version 1") == "the-record-version-1"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def _config_examples() -> list[tuple[str, str]]:
    out = []
    for doc in YAML_DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in _YAML_BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1)))
    return out


EXAMPLES = _config_examples()


def _completed(block: str, tmp_path: Path) -> dict[str, Any] | None:
    data = yaml.safe_load(block)
    assert isinstance(data, dict), "a yaml block in the docs should be a mapping"
    if NOT_PROXY_CONFIG & data.keys():
        return None
    data.setdefault("upstream", ["kafka-1:9092"])
    sasl = data.get("upstream_sasl")
    if isinstance(sasl, dict) and sasl.get("password_file") and not Path(sasl["password_file"]).exists():
        secret = tmp_path / "service.password"
        secret.write_text("secret\n", encoding="utf-8")
        sasl["password_file"] = str(secret)
    return data


def check_config(data: dict[str, Any], tmp_path: Path) -> int:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return main(["check-config", str(path)])


def test_the_docs_have_config_examples() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize(("where", "block"), EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_config_example_passes_check_config(where: str, block: str, tmp_path: Path) -> None:
    data = _completed(block, tmp_path)
    if data is None:
        pytest.skip("not a proxy config")
    assert check_config(data, tmp_path) == 0, f"{where} fails check-config"


def test_a_wrong_key_in_an_example_fails(tmp_path: Path) -> None:
    """The check is strict enough: the same example with one key misspelt is refused."""
    where, block = next((w, b) for w, b in EXAMPLES if re.search(r"^  mode: enforce", b, re.M))
    data = _completed(block.replace("  mode: enforce", "  moode: enforce"), tmp_path)
    assert data is not None
    assert check_config(data, tmp_path) != 0, f"{where} with quota.moode still passes"


def test_the_quota_keys_table_lists_every_kind_of_the_registry() -> None:
    """docs/quotas.md's table of quota keys says, for each kind in quota/kinds.py, the entities
    that may carry it, and lists no other key."""
    text = (ROOT / "docs" / "quotas.md").read_text(encoding="utf-8")
    table = text.split("| key | entity | what it limits |\n", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", table, re.M))

    def entities(kind: QuotaKind) -> str:
        if kind.clients:
            return "user, client-id"
        return "ip" if kind.ip else "user only"

    assert rows == {kind.key.value: entities(kind) for kind in kinds()}
