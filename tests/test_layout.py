"""The layout issue 38 asks for, kept: every list of quota kinds derived from the registry
(quota/kinds.py), no source file over 450 lines, every stage module imported by a test, and
the tests' folders mirroring the package's.

A list of kinds is what adding a kind would have to touch: a tuple, list, set or dict display
naming two or more built-in kinds (by `QuotaKey.X`, by key or by usage counter), or one function
comparing against two or more of them (an if/elif per kind). A stage or manager naming the one
kind it serves is that kind's own rule, not a list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from kafka_quota_proxy.quota.entities import QuotaKey
from kafka_quota_proxy.quota.kinds import BUILT_IN

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kafka_quota_proxy"
# Where the kinds are declared: the registry, and QuotaKey's names for the built-in keys.
DECLARED = {"quota/kinds.py", "quota/entities.py"}
# Lists of kinds kept on purpose, each with why. The generator's model of a fleet says how each
# built-in kind's demand looks over a day (a registered kind's counter is 0 in its records).
ALLOWED = {"analytics/generate.py": "the synthetic fleet's model of each built-in kind's demand"}
MAX_LINES = 450

_ATTRIBUTES = {name for name, value in vars(QuotaKey).items() if isinstance(value, QuotaKey)}
_NAMES = {kind.key.value for kind in BUILT_IN} | {
    kind.usage_counter for kind in BUILT_IN if kind.usage_counter}


def _kind(node: ast.AST) -> str | None:
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "QuotaKey"
            and node.attr in _ATTRIBUTES):
        return node.attr.lower()
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _NAMES:
        return node.value
    return None


def kind_lists(source: str) -> Iterator[tuple[int, set[str]]]:
    """(line, the kinds named) for each list of kinds in `source`."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            parts: list[ast.expr] = node.elts
        elif isinstance(node, ast.Dict):
            parts = [*(k for k in node.keys if k is not None), *node.values]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            parts = [side for compare in ast.walk(node) if isinstance(compare, ast.Compare)
                     for side in (compare.left, *compare.comparators)]
        else:
            continue
        named = {kind for kind in map(_kind, parts) if kind is not None}
        if len(named) >= 2:
            yield node.lineno, named


def _sources(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_guard_finds_a_list_of_kinds() -> None:
    """The check can fail: each shape of a list of kinds is found, one kind alone is not."""
    assert [named for _, named in kind_lists(
        "KEYS = (QuotaKey.PRODUCER_BYTE_RATE, QuotaKey.CONSUMER_BYTE_RATE)")] == [
        {"producer_byte_rate", "consumer_byte_rate"}]
    counters = 'COUNTERS = {"produce_bytes": 0, "x": 1, "new_producer_ids": 2}'
    assert [line for line, _ in kind_lists(counters)] == [1]
    assert [line for line, _ in kind_lists(
        "def rule(key):\n"
        "    if key == QuotaKey.REQUEST_PERCENTAGE:\n        return 1\n"
        "    elif key == 'controller_mutation_rate':\n        return 2\n")] == [1]
    assert list(kind_lists("KEY = QuotaKey.PRODUCER_IDS_RATE\nif key == KEY: pass\n")) == []


def test_no_list_of_quota_kinds_outside_the_registry() -> None:
    found = []
    for path in _sources(PACKAGE):
        name = path.relative_to(PACKAGE).as_posix()
        if name in DECLARED or name in ALLOWED:
            continue
        found += [f"{name}:{line}: {sorted(named)}" for line, named in kind_lists(path.read_text())]
    assert found == [], "derive these from quota/kinds.py (or say in ALLOWED why not)"


def test_the_allowed_lists_are_still_there() -> None:
    for name in ALLOWED:
        assert list(kind_lists((PACKAGE / name).read_text())), f"{name} has none: drop it from ALLOWED"


def test_no_source_file_over_450_lines() -> None:
    long = {p.relative_to(ROOT).as_posix(): n for p in _sources(PACKAGE, ROOT / "devkit", ROOT / "bench")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _imported_by_tests() -> set[str]:
    """Every module a test imports from (`from M import ...`, `import M`), and M.N for a name N
    imported from a package M."""
    found: set[str] = set()
    for path in _sources(ROOT / "tests"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
    return found


def test_every_stage_module_is_imported_by_a_test() -> None:
    stages = {f"kafka_quota_proxy.proxy.stages.{p.stem}" for p in (PACKAGE / "proxy" / "stages").glob("*.py")
              if p.stem != "__init__"}
    assert len(stages) > 20
    assert sorted(stages - _imported_by_tests()) == []


def test_the_tests_mirror_the_packages() -> None:
    """Each package folder with modules in it (not protocol/kafka_specs, Kafka's message specs
    as data) has its tests' folder of the same name."""
    modules = [p for p in _sources(PACKAGE) if p.name != "__init__.py"]
    packages = {p.parent.relative_to(PACKAGE) for p in modules} - {Path(".")}
    assert len(packages) > 10
    assert sorted(str(p) for p in packages if not (ROOT / "tests" / p).is_dir()) == []
