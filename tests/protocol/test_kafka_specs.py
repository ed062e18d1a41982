"""The vendored message specs (protocol/kafka_specs) are Kafka's own, byte for byte: those of the
kafka-clients jar devkit/pom.xml resolves, for every broker API kafka-python's codec lacks."""

from __future__ import annotations

import pytest

from devkit import kafka_specs


@pytest.mark.integration  # resolves Kafka's jars with Maven (cached after the first time)
def test_the_vendored_specs_are_the_jars(capsys: pytest.CaptureFixture[str]) -> None:
    assert kafka_specs.main(["--check"]) == 0, capsys.readouterr().err
    assert "54 files equal kafka-clients-4.4.0.jar's" in capsys.readouterr().out
