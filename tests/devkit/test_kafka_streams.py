"""devkit.kafka_streams without a JVM: the clear errors, the compile cache and the command line
(the application itself runs in tests/integration/test_kafka_streams.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit import kafka_streams
from devkit.kafka_jvm import KafkaError
from devkit.kafka_streams import CountApp

JAVA_17 = "#!/bin/sh\necho 'openjdk version \"17.0.15\" 2025-04-15' >&2\n"


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    folder = tmp_path / "kafka-4.4.0" / "lib"
    folder.mkdir(parents=True)
    for jar in ("kafka_2.13-4.4.0.jar", "kafka-streams-4.4.0.jar"):
        (folder / jar).touch()
    return folder


@pytest.fixture
def only_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """PATH holding a java that says 17 and nothing else (no javac); no JAVA_HOME."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "java").write_text(JAVA_17)
    (folder / "java").chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    return folder / "java"


def test_a_runtime_without_javac_says_a_jdk_is_needed(only_java: Path, lib: Path) -> None:
    with pytest.raises(KafkaError, match=r"no javac: .* needs a Java 17 JDK, not only a runtime"):
        kafka_streams.compile_app(lib)


def test_jars_without_kafka_streams_are_refused(lib: Path) -> None:
    (lib / "kafka-streams-4.4.0.jar").unlink()
    with pytest.raises(KafkaError, match=r"no kafka-streams jar in .*resolve the jars again"):
        kafka_streams.compile_app(lib)


def test_compiled_classes_are_kept_beside_the_jars_and_reused(only_java: Path, lib: Path) -> None:
    cached = lib.parent / f"streams-app-{kafka_streams._digest(kafka_streams.SOURCE, lib)}"
    cached.mkdir()
    (cached / "CountApp.class").touch()
    assert kafka_streams.compile_app(lib) == cached  # no javac needed


def test_the_cache_follows_the_source_and_the_jars(tmp_path: Path, lib: Path) -> None:
    digest = kafka_streams._digest(kafka_streams.SOURCE, lib)
    changed = tmp_path / "CountApp.java"
    changed.write_bytes(kafka_streams.SOURCE.read_bytes() + b"\n")
    assert kafka_streams._digest(changed, lib) != digest
    (lib / "kafka-streams-4.4.0.jar").rename(lib / "kafka-streams-4.5.0.jar")
    assert kafka_streams._digest(kafka_streams.SOURCE, lib) != digest


@pytest.mark.parametrize(("seen", "read"), [("::ffff:127.0.0.1", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"),
                                            ("::1", "::1")])
def test_a_dual_stack_peer_reads_as_its_ipv4_address(seen: str, read: str) -> None:
    assert kafka_streams._ipv4(seen) == read


def test_the_command_line_names_the_topics_and_the_streams_properties(only_java: Path, lib: Path,
                                                                     tmp_path: Path) -> None:
    app = CountApp("127.0.0.1:9092", "app-1", "numbers", "counts", 800, group_protocol="classic",
                   application_server="streams-app-1:7070", timeout=30, lib=lib,
                   properties_extra={"num.stream.threads": "2"})
    classes = tmp_path / "classes"
    cmd = app.command(classes, tmp_path)
    assert cmd[:2] == [str(only_java), "-Xmx256m"]
    assert cmd[cmd.index("-cp") + 1:] == [
        f"{classes}:{lib}/*", "CountApp", "numbers", "counts", "800", "30000",
        "bootstrap.servers=127.0.0.1:9092", "application.id=app-1", "group.protocol=classic",
        f"state.dir={tmp_path / 'state'}", "application.server=streams-app-1:7070", "num.stream.threads=2"]
    assert (tmp_path / "log4j2.properties").read_text().count("SYSTEM_ERR") == 1
