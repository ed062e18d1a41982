"""Every Kubernetes manifest in deploy/kubernetes/ against the Kubernetes API's own schemas.

kubernetes-validate ships the OpenAPI schemas of each Kubernetes minor version it supports as
JSON Schema inside its wheel and resolves their references in memory (`referencing`, no
retrieval), so nothing here needs a cluster or the network; the tests below refuse any socket
connection to make sure of it. Strict mode: a field the API does not know is an error, as
`kubectl apply --validate=strict` makes it, rather than silently dropped by the API server.
"""

from __future__ import annotations

import copy
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as k8s_validate

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"

# The schemas checked against: a current minor version, and 1.29, the oldest one the manifests'
# comments name (sidecar.yaml: a native sidecar needs Kubernetes >= 1.29).
CURRENT = "1.37"
OLDEST_NAMED = "1.29"
VERSIONS = (OLDEST_NAMED, CURRENT)


def manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.rglob("*") if p.suffix in (".yaml", ".yml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def document_id(path: Path, doc: dict[str, Any]) -> str:
    return f"{path.relative_to(MANIFESTS)}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


DOCUMENTS = [pytest.param(doc, id=document_id(path, doc))
             for path in manifest_files() for doc in documents(path)]


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach the network (a schema fetched by URL) fails the test."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network use during schema validation: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def validate(doc: dict[str, Any], version: str, *, strict: bool = True) -> str:
    """The minor version validated against; raises ValidationError or SchemaNotFoundError."""
    return k8s_validate.validate(doc, version, strict=strict)


def sidecar_deployment() -> dict[str, Any]:
    (deployment,) = [d for d in documents(MANIFESTS / "sidecar.yaml") if d["kind"] == "Deployment"]
    return copy.deepcopy(deployment)


def proxy_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "kafka-quota-proxy"]
    return container


def test_the_pinned_versions_are_shipped() -> None:
    shipped = {k8s_validate.major_minor(v) for v in k8s_validate.all_versions()}
    assert set(VERSIONS) <= shipped, f"kubernetes-validate ships {sorted(shipped)}"
    assert manifest_files() and DOCUMENTS


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", DOCUMENTS)
def test_manifest_document_matches_the_kubernetes_schema(doc: dict[str, Any], version: str) -> None:
    # The exact version's schemas, never an older one's fallback.
    assert validate(doc, version) == version


@pytest.mark.parametrize("version", VERSIONS)
def test_a_misspelt_field_is_rejected(version: str) -> None:
    deployment = sidecar_deployment()
    port = proxy_container(deployment)["ports"][0]
    port["containerPorts"] = port.pop("containerPort")
    with pytest.raises(k8s_validate.ValidationError):
        validate(deployment, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_misspelt_optional_field_is_rejected_only_in_strict_mode(version: str) -> None:
    # Without strict mode the API server would drop it and run the proxy with a writable root.
    deployment = sidecar_deployment()
    security = proxy_container(deployment)["securityContext"]
    security["readOnlyRootFileSystem"] = security.pop("readOnlyRootFilesystem")
    with pytest.raises(k8s_validate.ValidationError) as caught:
        validate(deployment, version)
    assert "readOnlyRootFileSystem" in caught.value.message
    assert validate(deployment, version, strict=False) == version


@pytest.mark.parametrize("version", VERSIONS)
def test_a_wrong_type_is_rejected(version: str) -> None:
    deployment = sidecar_deployment()
    proxy_container(deployment)["readinessProbe"]["periodSeconds"] = "5"
    with pytest.raises(k8s_validate.ValidationError) as caught:
        validate(deployment, version, strict=False)
    assert list(caught.value.path)[-1] == "periodSeconds"


def test_an_unknown_kind_is_not_passed_silently() -> None:
    doc = {"apiVersion": "apps/v1", "kind": "Deploymnet", "metadata": {"name": "x"}}
    with pytest.raises(k8s_validate.SchemaNotFoundError):
        validate(doc, CURRENT)
