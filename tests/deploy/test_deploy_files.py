"""Static checks of the container and deployment files.

Nothing here builds an image or starts a container (no Docker engine or cluster is assumed): the
Dockerfile, docker-compose.yml, the files they mount and the Kubernetes example are parsed and
cross-checked against each other, against pyproject.toml and against the proxy's own config
parser and metrics, so that a port, path or name that drifts in one place fails here.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from prometheus_client import CollectorRegistry

from kafka_quota_proxy.cli.main import main
from kafka_quota_proxy.config.quota_settings import QuotaSettings, default_state_file, validate_quota_entries
from kafka_quota_proxy.config.settings import HostPort, Settings, load_file, merge
from kafka_quota_proxy.config.store_settings import StoreSettings
from kafka_quota_proxy.proxy.observability.metrics import ProxyMetrics
from kafka_quota_proxy.proxy.observability.quota_metrics import QuotaCollector
from kafka_quota_proxy.proxy.observability.store_metrics import StoreCollector
from kafka_quota_proxy.proxy.quota_runtime.access import management_policy
from kafka_quota_proxy.proxy.quota_runtime.engine import QuotaEngine
from kafka_quota_proxy.proxy.store.sync import StoreSync
from kafka_quota_proxy.quota.entities import DEFAULT, QuotaEntity, QuotaKey
from kafka_quota_proxy.quota.kinds import client_keys, tenant_kinds
from kafka_quota_proxy.quota.resolution import QuotaStore
from tests.support.managers import (
    fetch_bytes,
    mutation_bucket,
    produce_bytes,
    producer_id_rate,
    request_time,
    topic_fetch,
    topic_produce,
)

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_PROXY_CONFIG = REPO / "deploy" / "compose" / "proxy.yaml"
# The compose demo's proxy replicas and their configs; `proxy` builds the image both run.
COMPOSE_REPLICAS = {"proxy": COMPOSE_PROXY_CONFIG, "proxy-2": REPO / "deploy" / "compose" / "proxy-2.yaml"}
# What may differ between the replicas' configs: the ports a replica is reached on.
PER_REPLICA_KEYS = ("listen", "node_port_base", "metrics")
PROMETHEUS_CONFIG = REPO / "deploy" / "compose" / "prometheus.yml"
GRAFANA_DATASOURCES = REPO / "deploy/compose/grafana/provisioning/datasources/prometheus.yml"
GRAFANA_DASHBOARD_PROVIDERS = REPO / "deploy/compose/grafana/provisioning/dashboards/dashboards.yml"
GRAFANA_DASHBOARDS_DIR = REPO / "deploy/compose/grafana/dashboards"
DASHBOARD = GRAFANA_DASHBOARDS_DIR / "kafka-quota-proxy.json"
K8S_SIDECAR = REPO / "deploy" / "kubernetes" / "sidecar.yaml"

CONFIG_PATH_IN_CONTAINER = "/etc/kafka-quota-proxy/proxy.yaml"
PYTHON_IMAGE = "python:3.12-slim"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
VALKEY_IMAGE = re.compile(r"valkey/valkey:(8|9)\.\d+\.\d+")  # the official image, a whole release
VALKEY_PORT = 6379  # valkey-server's default, which neither example changes
HEALTHY = {"condition": "service_healthy"}


# ---------------------------------------------------------------------------------------------
# Parsing helpers


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker too
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = " ".join((pending + line).split())
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continued instruction"
    return instructions


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in dockerfile_instructions():
        if keyword == "FROM":
            stages.append([])
        assert stages, f"{keyword} before the first FROM"
        stages[-1].append((keyword, args))
    return stages


def exposed_ports() -> set[int]:
    """The final stage's EXPOSE, ranges expanded."""
    exposed: set[int] = set()
    for item in dict(dockerfile_stages()[-1])["EXPOSE"].split():
        first, _, last = item.split("/")[0].partition("-")
        exposed.update(range(int(first), int(last or first) + 1))
    return exposed


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def copy_sources(args: str) -> tuple[list[str], dict[str, str]]:
    """The sources of a COPY instruction and its --flags."""
    tokens = shlex.split(args)
    flags: dict[str, str] = {}
    while tokens and tokens[0].startswith("--"):
        name, _, value = tokens.pop(0)[2:].partition("=")
        flags[name] = value
    if tokens and tokens[0].startswith("["):
        tokens = exec_form(" ".join(tokens))
    assert len(tokens) >= 2, f"COPY needs a source and a destination: {args}"
    return tokens[:-1], flags


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def ignored_by_dockerignore(path: str) -> bool:
    """Whether a context path (or a directory above it) matches an exclusion pattern."""
    parts = PurePosixPath(path.strip("/")).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            excluded = not negate
    return excluded


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def service(name: str) -> dict[str, Any]:
    return compose()["services"][name]


def published_ports(svc: dict[str, Any]) -> set[tuple[int, int]]:
    """(host port, container port) pairs of a compose service's `ports`."""
    pairs: set[tuple[int, int]] = set()
    for entry in svc.get("ports", []):
        if isinstance(entry, dict):
            pairs.add((int(entry["published"]), int(entry["target"])))
            continue
        text = str(entry).split("/")[0]  # drop /tcp
        fields = text.split(":")
        assert len(fields) in (2, 3), f"expected HOST:CONTAINER or IP:HOST:CONTAINER, got {entry!r}"
        pairs.add((int(fields[-2]), int(fields[-1])))
    return pairs


def bind_mounts(svc: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of a compose service's bind mounts."""
    mounts: list[tuple[str, str]] = []
    for entry in svc.get("volumes", []):
        if isinstance(entry, dict):
            if entry.get("type") == "bind":
                mounts.append((entry["source"], entry["target"]))
            continue
        source, target = entry.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


def mount_source_for(svc: dict[str, Any], host_file: Path) -> str:
    """The container path at which a compose service mounts a given repository file."""
    targets = [target for source, target in bind_mounts(svc) if (REPO / source).resolve() == host_file]
    assert len(targets) == 1, f"expected exactly one mount of {host_file}, got {targets}"
    return targets[0]


def compose_settings(replica: str = "proxy") -> Settings:
    return merge(load_file(COMPOSE_REPLICAS[replica]))


def compose_config_document(replica: str) -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_REPLICAS[replica].read_text(encoding="utf-8"))


def check_config(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """`kafka-quota-proxy check-config PATH`'s output; fails the test unless it exits 0."""
    status = main(["check-config", str(path)])
    out = capsys.readouterr().out
    assert status == 0, f"check-config {path} exited {status}: {out}"
    return out


def valkey_host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.scheme == "redis" and parts.hostname, url
    return parts.hostname, parts.port or VALKEY_PORT


def parse_duration(text: str) -> float:
    """Compose durations such as 40s, 1m30s, 1h."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def kafka_env() -> dict[str, str]:
    return {key: str(value) for key, value in service("kafka")["environment"].items()}


def listener_addresses(value: str) -> dict[str, HostPort]:
    """NAME -> HostPort from a Kafka listeners string such as PLAINTEXT://kafka:19092,..."""
    out: dict[str, HostPort] = {}
    for item in value.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        out[name] = HostPort(host, int(port))
    return out


def k8s_documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(K8S_SIDECAR.read_text(encoding="utf-8")) if doc]


def k8s_kind(kind: str) -> dict[str, Any]:
    found = [doc for doc in k8s_documents() if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def k8s_pod_spec() -> dict[str, Any]:
    return k8s_kind("Deployment")["spec"]["template"]["spec"]


def k8s_container(name: str) -> dict[str, Any]:
    found = [c for c in k8s_pod_spec()["containers"] if c["name"] == name]
    assert len(found) == 1, f"expected one container named {name}"
    return found[0]


def k8s_valkey_container() -> dict[str, Any]:
    (container,) = k8s_kind("StatefulSet")["spec"]["template"]["spec"]["containers"]
    return container


def secret_ref(container: dict[str, Any], variable: str) -> dict[str, str]:
    """The {name, key} of the Secret a container's environment variable is set from."""
    found = [e for e in container.get("env", []) if e["name"] == variable]
    assert len(found) == 1, f"{container['name']} sets {variable} {len(found)} times"
    return found[0]["valueFrom"]["secretKeyRef"]


@pytest.fixture
def k8s_config_file(tmp_path: Path) -> Path:
    """The sidecar's config file, as the ConfigMap mounts it."""
    config_file = tmp_path / "proxy.yaml"
    config_file.write_text(k8s_kind("ConfigMap")["data"]["proxy.yaml"], encoding="utf-8")
    return config_file


@pytest.fixture
def k8s_settings(k8s_config_file: Path) -> Settings:
    """The sidecar's config, as the proxy would read it from the mounted ConfigMap."""
    return merge(load_file(k8s_config_file))


# ---------------------------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_is_two_stage_python_312_slim() -> None:
    froms = [stage[0][1] for stage in dockerfile_stages()]
    assert froms == [f"{PYTHON_IMAGE} AS builder", PYTHON_IMAGE]
    python_version = PYTHON_IMAGE.split(":")[1].split("-")[0]
    assert python_version in SpecifierSet(pyproject()["project"]["requires-python"])


def test_dockerfile_copy_sources_exist_and_are_not_dockerignored() -> None:
    sources = []
    for stage in dockerfile_stages():
        for keyword, args in stage:
            if keyword == "COPY":
                srcs, flags = copy_sources(args)
                if "from" not in flags:
                    sources.extend(srcs)
    assert sources
    for src in sources:
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
        assert not ignored_by_dockerignore(src), f"Dockerfile copies {src}, but .dockerignore drops it"


def test_dockerfile_builder_copies_everything_the_wheel_needs() -> None:
    builder = dockerfile_stages()[0]
    copied = {src.strip("/") for keyword, args in builder if keyword == "COPY"
              for src in copy_sources(args)[0]}
    meta = pyproject()
    # The packages setuptools finds all live under their one top-level name.
    tops = {pattern.rstrip("*") for pattern in meta["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = {"pyproject.toml", *tops}
    readme = meta["project"].get("readme")
    if isinstance(readme, str) and (REPO / readme).exists():
        needed.add(readme)  # setuptools reads it into the wheel's metadata
    assert copied == needed
    assert ("RUN", "pip wheel --wheel-dir /wheels .") in builder


def test_dockerfile_final_stage_installs_the_wheel_only() -> None:
    final = dockerfile_stages()[-1]
    runs = [args for keyword, args in final if keyword == "RUN"]
    install = [run for run in runs if "pip install" in run]
    assert install == [
        "--mount=type=bind,from=builder,source=/wheels,target=/wheels "
        f"pip install --no-index --find-links=/wheels {pyproject()['project']['name']}"
    ]
    assert [keyword for keyword, _ in final if keyword == "COPY"] == []


def test_dockerfile_entrypoint_is_the_console_script() -> None:
    final = dict(dockerfile_stages()[-1])
    scripts = pyproject()["project"]["scripts"]
    assert list(scripts) == ["kafka-quota-proxy"]
    assert exec_form(final["ENTRYPOINT"]) == ["kafka-quota-proxy"]
    assert exec_form(final["CMD"]) == ["--config", CONFIG_PATH_IN_CONTAINER]


def test_dockerfile_runs_as_non_root_and_stops_with_sigterm() -> None:
    final = dict(dockerfile_stages()[-1])
    assert final["USER"] == "10001:10001"
    assert final["STOPSIGNAL"] == "SIGTERM"


def test_dockerfile_exposes_default_and_compose_ports() -> None:
    exposed = exposed_ports()
    assert exposed == {9092, *range(9093, 9100), 9404}
    default_listen = Settings.__dataclass_fields__["listen"].default
    assert isinstance(default_listen, HostPort) and default_listen.port == 9092
    s = compose_settings()
    assert {s.listen.port, s.node_port(0), s.node_port(1), s.metrics.port} <= exposed


# ---------------------------------------------------------------------------------------------
# docker-compose.yml


def test_compose_services_and_images() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "proxy", "proxy-2", "valkey", "prometheus", "grafana"}
    assert set(COMPOSE_REPLICAS) <= set(services)
    assert services["kafka"]["image"] == "apache/kafka:3.9.0"
    assert services["proxy"]["build"] == "."
    # One build: the second replica runs the image the first one built, never a pulled one.
    assert "build" not in services["proxy-2"]
    assert services["proxy-2"]["image"] == services["proxy"]["image"]
    assert services["proxy-2"]["pull_policy"] == "never"
    assert VALKEY_IMAGE.fullmatch(services["valkey"]["image"]), services["valkey"]["image"]
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")


def test_compose_mounted_files_exist() -> None:
    mounts = [m for svc in compose()["services"].values() for m in bind_mounts(svc)]
    assert len(mounts) == 6
    for source, _ in mounts:
        assert (REPO / source).exists(), f"docker-compose.yml mounts {source}, which does not exist"


def test_compose_proxy_config_is_valid_and_mounted_where_the_command_reads_it() -> None:
    proxy = service("proxy")
    assert proxy["command"] == ["--config", CONFIG_PATH_IN_CONTAINER]
    assert mount_source_for(proxy, COMPOSE_PROXY_CONFIG) == CONFIG_PATH_IN_CONTAINER
    s = compose_settings()
    assert s.listen == HostPort("0.0.0.0", 9092)
    assert s.upstream == (HostPort("kafka", 19092),)
    assert s.advertised_host == "localhost"
    assert s.node_port(1) == 9094
    assert s.metrics == HostPort("0.0.0.0", 9404)


def test_compose_kafka_is_kraft_node_1_advertising_the_proxy_upstream() -> None:
    env = kafka_env()
    assert env["KAFKA_NODE_ID"] == "1"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    advertised = listener_addresses(env["KAFKA_ADVERTISED_LISTENERS"])
    listeners = listener_addresses(env["KAFKA_LISTENERS"])
    (upstream,) = compose_settings().upstream
    assert advertised == {"PLAINTEXT": upstream}
    assert upstream.host == "kafka" and service("kafka")["hostname"] == "kafka"
    assert listeners["PLAINTEXT"].port == upstream.port
    controller = listeners[env["KAFKA_CONTROLLER_LISTENER_NAMES"]]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:{controller.port}"
    assert "CONTROLLER" not in advertised
    assert "ports" not in service("kafka")


def test_compose_replicas_read_their_own_config() -> None:
    for name, config in COMPOSE_REPLICAS.items():
        replica = service(name)
        assert replica["command"] == ["--config", CONFIG_PATH_IN_CONTAINER], name
        assert mount_source_for(replica, config.resolve()) == CONFIG_PATH_IN_CONTAINER, name


@pytest.mark.parametrize("replica", COMPOSE_REPLICAS)
def test_compose_proxy_publishes_listen_node_and_metrics_ports_on_the_same_host_ports(replica: str) -> None:
    s = compose_settings(replica)
    node_id = int(kafka_env()["KAFKA_NODE_ID"])
    wanted = {s.listen.port, s.node_port(node_id), s.metrics.port}
    assert len(wanted) == 3
    # Same port on the host: clients are told localhost:<node port>, which must reach the proxy.
    assert published_ports(service(replica)) == {(port, port) for port in wanted}


def test_compose_published_host_ports_do_not_collide() -> None:
    published = [(host, name) for name, svc in compose()["services"].items()
                 for host, _ in published_ports(svc)]
    hosts = [host for host, _ in published]
    assert len(hosts) == len(set(hosts)), sorted(published)
    # The replicas' own ports apart too, so that one container cannot bind the same port twice.
    for name in COMPOSE_REPLICAS:
        s = compose_settings(name)
        own = [s.listen.port, s.node_port(int(kafka_env()["KAFKA_NODE_ID"])), s.metrics.port]
        assert len(own) == len(set(own)), name


@pytest.mark.parametrize("replica", COMPOSE_REPLICAS)
def test_compose_proxy_health_check_and_stop_grace_period(replica: str) -> None:
    s = compose_settings(replica)
    proxy = service(replica)
    test = proxy["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert f"http://127.0.0.1:{s.metrics.port}/metrics" in test[3]
    # podman 4.3's Docker API splits exec-form arguments at spaces (seen by make compose-demo).
    assert all(" " not in arg for arg in test), test
    assert parse_duration(proxy["stop_grace_period"]) > s.shutdown_timeout_seconds
    assert proxy["depends_on"] == {"kafka": HEALTHY, "valkey": HEALTHY}


def test_compose_valkey_is_health_checked_and_kept_inside() -> None:
    valkey = service("valkey")
    assert valkey["healthcheck"]["test"] == ["CMD-SHELL", "valkey-cli ping | grep -q PONG"]
    assert "ports" not in valkey  # only the proxies use it
    assert "command" not in valkey  # so it listens on the default port, VALKEY_PORT


@pytest.mark.parametrize("replica", COMPOSE_REPLICAS)
def test_compose_replicas_store_url_names_the_compose_valkey(replica: str) -> None:
    store = compose_settings(replica).store
    assert store is not None, f"{COMPOSE_REPLICAS[replica].name} has no store: section"
    host, port = valkey_host_port(store.url)
    assert host in compose()["services"] and compose()["services"][host]["hostname"] == host
    assert VALKEY_IMAGE.fullmatch(service(host)["image"])
    assert port == VALKEY_PORT
    assert not store.cluster and store.password_env is None


@pytest.mark.parametrize("replica", COMPOSE_REPLICAS)
def test_compose_replica_config_passes_check_config(replica: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = check_config(COMPOSE_REPLICAS[replica], capsys)
    assert "quota state shared through redis://valkey:6379" in out
    assert "warning" not in out


def test_compose_replica_configs_differ_only_in_their_ports() -> None:
    documents = {name: compose_config_document(name) for name in COMPOSE_REPLICAS}
    shared = [{k: v for k, v in doc.items() if k not in PER_REPLICA_KEYS} for doc in documents.values()]
    # A quota the replicas share means something only if each enforces the same one.
    assert all(doc == shared[0] for doc in shared), "the replicas' configs differ beyond their ports"
    for key in PER_REPLICA_KEYS:
        values = [doc[key] for doc in documents.values()]
        assert len(set(values)) == len(values), f"replicas share {key}: {values}"


def test_prometheus_scrapes_every_proxy_replica() -> None:
    prometheus = service("prometheus")
    assert mount_source_for(prometheus, PROMETHEUS_CONFIG) == "/etc/prometheus/prometheus.yml"
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"{name}:{compose_settings(name).metrics.port}" for name in COMPOSE_REPLICAS]
    for target in targets:
        host, _, port = target.rpartition(":")
        assert host in compose()["services"]
        assert int(port) == compose_settings(host).metrics.port
    assert set(COMPOSE_REPLICAS) <= set(prometheus["depends_on"])


def test_grafana_datasource_points_at_the_prometheus_service() -> None:
    grafana = service("grafana")
    assert (mount_source_for(grafana, GRAFANA_DATASOURCES)
            == "/etc/grafana/provisioning/datasources/prometheus.yml")
    (datasource,) = yaml.safe_load(GRAFANA_DATASOURCES.read_text(encoding="utf-8"))["datasources"]
    assert datasource["type"] == "prometheus"
    url = urlsplit(datasource["url"])
    assert url.scheme == "http"
    assert url.hostname == "prometheus" and url.hostname in compose()["services"]
    assert url.port == 9090
    assert (9090, url.port) in published_ports(service("prometheus"))


def test_grafana_dashboard_provider_loads_the_dashboard_folder() -> None:
    grafana = service("grafana")
    assert (mount_source_for(grafana, GRAFANA_DASHBOARD_PROVIDERS)
            == "/etc/grafana/provisioning/dashboards/dashboards.yml")
    dashboards_in_container = mount_source_for(grafana, GRAFANA_DASHBOARDS_DIR.resolve())
    (provider,) = yaml.safe_load(GRAFANA_DASHBOARD_PROVIDERS.read_text(encoding="utf-8"))["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == dashboards_in_container
    assert sorted(p.name for p in GRAFANA_DASHBOARDS_DIR.iterdir()) == ["kafka-quota-proxy.json"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_in_container}/{DASHBOARD.name}"


# ---------------------------------------------------------------------------------------------
# Grafana dashboard against the proxy's metrics

METRIC_SOURCES = (REPO / "kafka_quota_proxy/proxy/observability/metrics.py",
                  REPO / "kafka_quota_proxy/proxy/observability/quota_metrics.py",
                  REPO / "kafka_quota_proxy/proxy/observability/store_metrics.py")
METRIC_PREFIX = "kafka_quota_proxy_"
GRID_COLUMNS = 24
# Labels whose values are a closed set the populated registry below emits in full.
ENUMERATED_LABELS = ("quota_type", "mode")
# Labels Prometheus adds to every series it scrapes (the target's), so queries may group by them.
SCRAPE_LABELS = {"instance", "job"}
GRAFANA_BUILTIN_VARIABLES = ("__rate_interval", "__interval", "__range", "__interval_ms",
                             "__range_s", "__range_ms")
ORIGINAL_PANELS = {
    "Requests/s per API":
        "sum by (api) (rate(kafka_quota_proxy_requests_total[$__rate_interval]))",
    "Proxy-to-broker latency p99 per API":
        "histogram_quantile(0.99, sum by (api, le) "
        "(rate(kafka_quota_proxy_upstream_latency_seconds_bucket[$__rate_interval])))",
    "Open client connections": "sum(kafka_quota_proxy_connections_open)",
}
QUOTA_PANELS = [
    ("Quotas per tenant", "row"),
    ("Quota mode", "stat"),
    ("Quota entities dropped", "stat"),
    ("Configured quotas", "table"),
    ("Produce rate vs quota per tenant", "timeseries"),
    ("Fetch rate vs quota per tenant", "timeseries"),
    ("Request time vs quota per tenant", "timeseries"),
    ("Throttle time per tenant", "timeseries"),
    ("New producer ids vs quota per user", "timeseries"),
    ("Producer-id refusals and throttle per user", "timeseries"),
]
TOPIC_PANELS = [
    ("Topic quotas", "row"),
    ("Topic rate vs its share per broker", "timeseries"),
    ("Topic throttle time", "timeseries"),
]
STORE_PANELS = [
    ("Shared quota store", "row"),
    ("Store state per replica", "state-timeline"),
    ("Replicas seen", "timeseries"),
    ("Store sync lag per replica", "timeseries"),
    ("Store sync duration p99 per replica", "timeseries"),
    ("Store errors and syncs per second", "timeseries"),
    ("Produce rate per tenant: all replicas vs each", "timeseries"),
    ("Fetch rate per tenant: all replicas vs each", "timeseries"),
]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def provisioned_datasource() -> dict[str, str]:
    (datasource,) = yaml.safe_load(GRAFANA_DATASOURCES.read_text(encoding="utf-8"))["datasources"]
    return {"type": datasource["type"], "uid": datasource["uid"]}


def panel_by_title(title: str) -> dict[str, Any]:
    (panel,) = [p for p in dashboard()["panels"] if p["title"] == title]
    return panel


def targets(panel: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["refId"]: t for t in panel.get("targets", [])}


def all_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def throttle_quota_types() -> set[str]:
    """The quota_type values the proxy counts a tenant's throttles under: its quota kinds'
    (quota/kinds.py, where the stages' throttle() calls find them)."""
    return {kind.throttle_type for kind in tenant_kinds()}


def declared_metric_families() -> set[str]:
    """Family names as observability/metrics.py and quota_metrics.py spell them: prefix + "name"."""
    names: set[str] = set()
    for source in METRIC_SOURCES:
        names.update(METRIC_PREFIX + n for n in re.findall(r'\b[pP] \+ "(\w+)"',
                                                           source.read_text(encoding="utf-8")))
    return names


def populated_registry() -> CollectorRegistry:
    """A proxy's registry with a store: section (ProxyMetrics, its StoreCollector and QuotaCollector,
    as proxy/server.py wires them) with at least one series in every family the dashboard can use,
    so label names can be read off."""
    now = 1_000
    client = {key: 10.0 for key in client_keys()}
    store = QuotaStore({QuotaEntity(client_id="demo"): client,
                        QuotaEntity(user=DEFAULT): {QuotaKey.PRODUCER_IDS_RATE: 0.001},
                        QuotaEntity(ip=DEFAULT): {QuotaKey.CONNECTION_CREATION_RATE: 5.0},
                        QuotaEntity(topic="orders"): {QuotaKey.PRODUCER_BYTE_RATE: 10.0,
                                                      QuotaKey.CONSUMER_BYTE_RATE: 10.0}})
    store_settings = StoreSettings(url="redis://valkey:6379")
    engine = QuotaEngine(QuotaSettings(), store, clock=lambda: now,
                         shared_buckets=store_settings.effective_buckets)
    assert engine.shared is not None
    managers = engine.scope("kafka:19092")
    produce_bytes(managers).record_and_get_throttle_ms("alice", "demo", 100.0, now)
    fetch_bytes(managers).record_and_get_throttle_ms("alice", "demo", 100.0, now)
    request_time(managers).record_and_get_throttle_ms("alice", "demo", 5.0, now)
    mutation_bucket(managers).record_permissive("alice", "demo", 1.0, now)
    producer_id_rate(managers).charge("alice", [1], now)
    producer_id_rate(managers).charge("alice", list(range(2, 100)), now, strict=True)  # a refusal
    topic_produce(managers).record("orders", 100.0, now)
    topic_fetch(managers).record("orders", 100.0, now)
    for quota_type in ("topic_produce", "topic_fetch"):
        engine.topic_throttles.add(quota_type, "orders", "", 10, now)
    for quota_type in throttle_quota_types():
        engine.throttles.add(quota_type, "alice", "demo", 10, now)
    engine.connection_throttles.add("connection_creation_rate", "10.0.0.1", "", 10, now)
    metrics = ProxyMetrics()
    metrics.api(0)
    metrics.protocol_errors.labels("bad_size")
    # Never connects: the collector only reads the sync's numbers.
    metrics.registry.register(StoreCollector(StoreSync(store_settings, engine.shared), lambda: now))
    metrics.registry.register(QuotaCollector(engine))
    return metrics.registry


@dataclass
class ExportedSeries:
    """One series name as a Prometheus scrape of the proxy stores it."""

    family_type: str
    labels: set[str] = field(default_factory=set)
    values: dict[str, set[str]] = field(default_factory=dict)


def exported_series() -> dict[str, ExportedSeries]:
    """Every series name the proxy exports (counters as <name>_total, histograms as _bucket, _sum,
    _count), with the labels and label values seen on the populated registry."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "gauge": ("",)}
    out: dict[str, ExportedSeries] = {}
    for family in populated_registry().collect():
        for suffix in suffixes[family.type]:
            out[family.name + suffix] = ExportedSeries(family.type)
        for sample in family.samples:
            series = out.setdefault(sample.name, ExportedSeries(family.type))
            series.labels.update(sample.labels)
            for label, value in sample.labels.items():
                series.values.setdefault(label, set()).add(value)
    return out


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(metric, [(label, operator, value)]) for every kafka_quota_proxy_ selector of a PromQL expr."""
    found = []
    for match in re.finditer(rf"({METRIC_PREFIX}\w+)(?:\{{([^}}]*)\}})?", expr):
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', match.group(2) or "")
        found.append((match.group(1), matchers))
    return found


def variable_references(text: str) -> set[str]:
    names = set(re.findall(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", text))
    return {n for group in names for n in group if n} - set(GRAFANA_BUILTIN_VARIABLES)


def test_metric_families_declared_in_the_source_are_all_collected() -> None:
    collected = {family.name for family in populated_registry().collect()}
    declared = declared_metric_families()
    assert declared, "no metric names found in observability/metrics.py or observability/quota_metrics.py"
    assert declared <= collected, f"declared but not collected: {sorted(declared - collected)}"
    series = exported_series()
    assert series["kafka_quota_proxy_requests_total"].family_type == "counter"
    assert series["kafka_quota_proxy_throttle_time_ms_total"].family_type == "counter"
    assert series["kafka_quota_proxy_upstream_latency_seconds_bucket"].family_type == "histogram"
    assert series["kafka_quota_proxy_byte_rate"].family_type == "gauge"
    assert series["kafka_quota_proxy_byte_rate_local"].labels == series["kafka_quota_proxy_byte_rate"].labels
    assert series["kafka_quota_proxy_store_sync_duration_seconds_bucket"].family_type == "histogram"
    assert "kafka_quota_proxy_throttle_time_ms" not in series  # counters are scraped as _total


def test_grafana_dashboard_keeps_the_proxy_panels() -> None:
    d = dashboard()
    assert d["uid"] == "kafka-quota-proxy"
    assert d["schemaVersion"] == 39
    panels = d["panels"]
    assert [p["title"] for p in panels[:3]] == list(ORIGINAL_PANELS)
    for panel in panels[:3]:
        assert [t["expr"] for t in panel["targets"]] == [ORIGINAL_PANELS[panel["title"]]]
    assert [(p["title"], p["type"]) for p in panels[3:]] == QUOTA_PANELS + TOPIC_PANELS + STORE_PANELS


def test_grafana_dashboard_queries_metrics_the_proxy_exports() -> None:
    series = exported_series()
    exprs = all_exprs()
    assert len(exprs) == 31
    for expr in exprs:
        used = selectors(expr)
        assert used, f"expression queries no proxy metric: {expr}"
        for name, matchers in used:
            assert name in series, f"the proxy does not export {name} (in {expr})"
            exported = series[name]
            for label, operator, value in matchers:
                assert label in exported.labels, f"{name} has no label {label} (in {expr})"
                if label in ENUMERATED_LABELS and operator in ("=", "=~") and "$" not in value:
                    wanted = set(value.split("|")) if operator == "=~" else {value}
                    assert wanted <= exported.values[label], (
                        f"{name} never has {label} in {sorted(wanted - exported.values[label])}")
        labels = set().union(SCRAPE_LABELS, *(series[name].labels for name, _ in used))
        for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in filter(None, (s.strip() for s in clause.split(","))):
                assert label in labels, f"aggregation by {label}, which no queried metric has: {expr}"


def test_grafana_dashboard_legends_use_labels_the_queries_return() -> None:
    series = exported_series()
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            used = [name for name, _ in selectors(target["expr"]) if name in series]
            labels = set().union(SCRAPE_LABELS, *(series[name].labels for name in used))
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
                assert label in labels, f"{panel['title']}: legend uses {label}, not a label of the query"


def test_grafana_dashboard_panels_use_the_provisioned_datasource() -> None:
    datasource = provisioned_datasource()
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            assert "targets" not in panel
            continue
        assert panel["datasource"] == datasource, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), f"{panel['title']}: refIds {refs}"
        for target in panel["targets"]:
            assert target["datasource"] == datasource, panel["title"]


def test_grafana_dashboard_panel_ids_are_unique() -> None:
    ids = [p["id"] for p in dashboard()["panels"]]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"


def test_grafana_dashboard_grid_positions_do_not_overlap() -> None:
    boxes = []
    for panel in dashboard()["panels"]:
        g = panel["gridPos"]
        x, y, w, h = g["x"], g["y"], g["w"], g["h"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0, panel["title"]
        assert x + w <= GRID_COLUMNS, f"{panel['title']} is wider than the grid"
        if panel["type"] == "row":
            assert (x, w, h) == (0, GRID_COLUMNS, 1), panel["title"]
        boxes.append((panel["title"], x, y, w, h))
    for i, (a, ax, ay, aw, ah) in enumerate(boxes):
        for b, bx, by, bw, bh in boxes[i + 1:]:
            overlap = ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah
            assert not overlap, f"panels {a!r} and {b!r} overlap"


def test_grafana_dashboard_template_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert list(variables) == ["user", "client_id", "topic"]
    series = exported_series()
    for name, variable in variables.items():
        assert variable["type"] == "query"
        assert variable["datasource"] == provisioned_datasource()
        metric = "kafka_quota_proxy_topic_byte_rate" if name == "topic" else "kafka_quota_proxy_byte_rate"
        query = f"label_values({metric}, {name})"
        assert variable["definition"] == query and variable["query"]["query"] == query
        assert name in series[metric].labels
        assert variable["multi"] is True and variable["includeAll"] is True
        # Not Grafana's default All (the values found, joined): those leave out the entities
        # measured with an empty tag and raw principals that only the throttle counters carry.
        assert variable["allValue"] == ".*"
    referenced: set[str] = set()
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            referenced |= variable_references(target["expr"] + target.get("legendFormat", ""))
    assert referenced == set(variables), f"variables used {referenced}, defined {set(variables)}"


@pytest.mark.parametrize(("title", "quota_type", "measured"), [
    ("Produce rate vs quota per tenant", "producer_byte_rate", "kafka_quota_proxy_byte_rate"),
    ("Fetch rate vs quota per tenant", "consumer_byte_rate", "kafka_quota_proxy_byte_rate"),
    ("Request time vs quota per tenant", "request_percentage", "kafka_quota_proxy_request_time_percent"),
])
def test_grafana_rate_vs_quota_panels(title: str, quota_type: str, measured: str) -> None:
    panel = panel_by_title(title)
    by_ref = targets(panel)
    assert set(by_ref) == {"A", "B"}
    (measured_selector,) = selectors(by_ref["A"]["expr"])
    (limit_selector,) = selectors(by_ref["B"]["expr"])
    assert measured_selector[0] == measured
    assert limit_selector[0] == "kafka_quota_proxy_quota_limit"
    assert ("quota_type", "=", quota_type) in limit_selector[1]
    if measured == "kafka_quota_proxy_byte_rate":
        assert ("quota_type", "=", quota_type) in measured_selector[1]
    for _, matchers in (measured_selector, limit_selector):
        assert ("user", "=~", "$user") in matchers and ("client_id", "=~", "$client_id") in matchers
    assert by_ref["A"]["legendFormat"] == "{{user}} {{client_id}}"
    assert by_ref["B"]["legendFormat"] == "{{user}} {{client_id}} quota"
    (override,) = panel["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byFrameRefID", "options": "B"}
    line_style = {p["id"]: p["value"] for p in override["properties"]}["custom.lineStyle"]
    assert line_style["fill"] == "dash"
    unit = panel["fieldConfig"]["defaults"]["unit"]
    assert unit == ("percent" if quota_type == "request_percentage" else "binBps")


def test_grafana_throttle_time_panel() -> None:
    panel = panel_by_title("Throttle time per tenant")
    (target,) = panel["targets"]
    expr = target["expr"]
    assert expr.startswith("sum by (quota_type, user, client_id) "
                           "(rate(kafka_quota_proxy_throttle_time_ms_total{")
    assert expr.endswith("}[1m])) / 1000")  # ms of throttle per second -> seconds per second
    ((_, matchers),) = selectors(expr)
    (quota_types,) = [v for label, op, v in matchers if label == "quota_type" and op == "=~"]
    assert set(quota_types.split("|")) == {"produce", "fetch", "request"} <= throttle_quota_types()
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_grafana_quota_overview_panels() -> None:
    (mode,) = panel_by_title("Quota mode")["targets"]
    assert mode["expr"] == "max by (mode) (kafka_quota_proxy_quota_mode) == 1"
    assert mode["instant"] is True and panel_by_title("Quota mode")["options"]["textMode"] == "name"
    (dropped,) = panel_by_title("Quota entities dropped")["targets"]
    assert dropped["expr"] == "sum(kafka_quota_proxy_quota_entities_dropped_total)"
    table = panel_by_title("Configured quotas")
    (configured,) = table["targets"]
    assert selectors(configured["expr"]) == [("kafka_quota_proxy_configured_quota", [])]
    assert configured["instant"] is True and configured["format"] == "table"


def test_grafana_store_panels() -> None:
    row = panel_by_title(STORE_PANELS[0][0])
    store = [panel_by_title(title) for title, _ in STORE_PANELS[1:]]
    # Under their own row, below every other panel.
    bottom = row["gridPos"]["y"]
    assert all(p["gridPos"]["y"] > bottom for p in store)
    others = [p for p in dashboard()["panels"] if p["id"] not in {row["id"], *(p["id"] for p in store)}]
    assert all(p["gridPos"]["y"] + p["gridPos"]["h"] <= bottom for p in others)
    # Every store metric docs/metrics.md names for the store's health, and the global vs local rate.
    used = {name for p in store for t in p["targets"] for name, _ in selectors(t["expr"])}
    wanted = {"store_sync_lag_seconds", "store_sync_duration_seconds_bucket", "store_errors_total",
              "store_degraded", "store_replicas", "byte_rate", "byte_rate_local"}
    assert {METRIC_PREFIX + name for name in wanted} <= used
    # The store's health is each replica's: drawn per scraped instance, never summed across them.
    for panel in store:
        for target in panel["targets"]:
            if "_store_" in target["expr"] and not target["expr"].startswith("count("):
                assert re.search(r"\bby \(instance\b", target["expr"]), target["expr"]
                assert "{{instance}}" in target["legendFormat"], panel["title"]
    (p99,) = panel_by_title("Store sync duration p99 per replica")["targets"]
    assert p99["expr"] == ("histogram_quantile(0.99, sum by (instance, le) "
                           "(rate(kafka_quota_proxy_store_sync_duration_seconds_bucket[$__rate_interval])))")
    state = panel_by_title("Store state per replica")
    (mapping,) = state["fieldConfig"]["defaults"]["mappings"]
    assert {value: m["text"] for value, m in mapping["options"].items()} == {"0": "shared", "1": "degraded"}
    (degraded,) = state["targets"]
    assert degraded["expr"] == "max by (instance) (kafka_quota_proxy_store_degraded)"
    units = {p["title"]: p["fieldConfig"]["defaults"].get("unit") for p in store}
    assert units["Store sync lag per replica"] == units["Store sync duration p99 per replica"] == "s"


@pytest.mark.parametrize(("title", "quota_type"), [
    ("Produce rate per tenant: all replicas vs each", "producer_byte_rate"),
    ("Fetch rate per tenant: all replicas vs each", "consumer_byte_rate"),
])
def test_grafana_global_vs_local_rate_panels(title: str, quota_type: str) -> None:
    panel = panel_by_title(title)
    by_ref = targets(panel)
    assert set(by_ref) == {"A", "B"}
    (everyone,) = selectors(by_ref["A"]["expr"])
    (own,) = selectors(by_ref["B"]["expr"])
    assert (everyone[0], own[0]) == ("kafka_quota_proxy_byte_rate", "kafka_quota_proxy_byte_rate_local")
    # The same entities on both sides; each replica's part per replica, per broker as the whole is.
    assert everyone[1] == own[1]
    assert ("quota_type", "=", quota_type) in own[1]
    assert ("user", "=~", "$user") in own[1] and ("client_id", "=~", "$client_id") in own[1]
    assert by_ref["A"]["expr"].startswith("max by (scope, user, client_id) (")
    assert by_ref["B"]["expr"].startswith("max by (instance, scope, user, client_id) (")
    assert "{{instance}}" in by_ref["B"]["legendFormat"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "binBps"


@pytest.mark.parametrize("replica", COMPOSE_REPLICAS)
def test_compose_proxy_config_has_an_example_quota(replica: str) -> None:
    s = compose_settings(replica)
    assert (s.quota.scope, s.quota.mode) == ("broker", "enforce")
    quotas = validate_quota_entries(s.quotas, str(COMPOSE_REPLICAS[replica]))
    assert quotas[QuotaEntity(client_id="demo-limited")][QuotaKey.PRODUCER_BYTE_RATE] == 1048576
    # The config is bind-mounted read-only, so AlterClientQuotas must keep its state elsewhere.
    state_file = PurePosixPath(str(default_state_file(CONFIG_PATH_IN_CONTAINER, s.quota)))
    for _, target in bind_mounts(service(replica)):
        assert not state_file.is_relative_to(PurePosixPath(target).parent), state_file


# ---------------------------------------------------------------------------------------------
# Kubernetes sidecar example


def test_k8s_documents() -> None:
    assert [doc["kind"] for doc in k8s_documents()] == ["ConfigMap", "Secret", "Service", "StatefulSet",
                                                         "Deployment"]
    assert [c["name"] for c in k8s_pod_spec()["containers"]] == ["app", "kafka-quota-proxy"]


def test_k8s_config_map_is_mounted_where_the_proxy_reads_it() -> None:
    config_map = k8s_kind("ConfigMap")
    proxy = k8s_container("kafka-quota-proxy")
    assert proxy["args"] == ["--config", CONFIG_PATH_IN_CONTAINER]
    (mount,) = [m for m in proxy["volumeMounts"]
                if m["mountPath"] == str(PurePosixPath(CONFIG_PATH_IN_CONTAINER).parent)]
    assert mount["readOnly"] is True
    (volume,) = [v for v in k8s_pod_spec()["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    (item,) = volume["configMap"]["items"]
    assert item["key"] in config_map["data"]
    assert f"{mount['mountPath']}/{item['path']}" == CONFIG_PATH_IN_CONTAINER
    assert proxy["image"].split(":")[0] == pyproject()["project"]["name"]


def test_k8s_config_is_pod_local(k8s_settings: Settings) -> None:
    s = k8s_settings
    assert s.upstream == (HostPort("kafka-bootstrap.kafka.svc", 9092),)
    assert s.advertised_host == "127.0.0.1"
    assert s.listen.host in WILDCARD_HOSTS  # the kubelet probes the pod IP, not 127.0.0.1
    (env,) = k8s_container("app")["env"]
    assert env == {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": f"{s.advertised_host}:{s.listen.port}"}


def test_k8s_container_ports_match_the_config(k8s_settings: Settings) -> None:
    s = k8s_settings
    ports = {p["name"]: p["containerPort"] for p in k8s_container("kafka-quota-proxy")["ports"]}
    assert ports["kafka"] == s.listen.port
    assert ports["metrics"] == s.metrics.port
    node_ports = {name: port for name, port in ports.items() if name.startswith("node-")}
    assert node_ports == {f"node-{n}": s.node_port(n) for n in range(3)}
    assert len(set(ports.values())) == len(ports)
    readiness = k8s_container("kafka-quota-proxy")["readinessProbe"]
    assert readiness["tcpSocket"] == {"port": s.listen.port}


def test_k8s_proxy_container_runs_the_image_as_built(k8s_settings: Settings) -> None:
    proxy = k8s_container("kafka-quota-proxy")
    # No `command`: it would replace the image's ENTRYPOINT (its `args` replace CMD, checked above).
    assert "command" not in proxy
    assert {p["containerPort"] for p in proxy["ports"]} <= exposed_ports()
    # Prometheus scrapes the pod IP (the annotations below), so metrics too listen on every interface.
    assert k8s_settings.metrics.host in WILDCARD_HOSTS


def test_k8s_probe_ports_are_declared_container_ports() -> None:
    pod_specs = [k8s_pod_spec(), k8s_kind("StatefulSet")["spec"]["template"]["spec"]]
    probed = 0
    for container in (c for spec in pod_specs for c in spec["containers"]):
        declared = {p["containerPort"] for p in container.get("ports", [])}
        declared |= {p["name"] for p in container.get("ports", []) if "name" in p}
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            for action in ("tcpSocket", "httpGet", "grpc"):
                port = container.get(kind, {}).get(action, {}).get("port")
                if port is not None:
                    assert port in declared, f"{container['name']} {kind} probes {port}, not a containerPort"
                    probed += 1
    assert probed == 2  # the proxy's readiness (the listen port) and Valkey's liveness


def test_k8s_prometheus_annotations_match_the_metrics_port(k8s_settings: Settings) -> None:
    annotations = k8s_kind("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(k8s_settings.metrics.port),
        "prometheus.io/path": "/metrics",
    }


def test_k8s_grace_period_exceeds_the_shutdown_timeout(k8s_settings: Settings) -> None:
    grace = k8s_pod_spec()["terminationGracePeriodSeconds"]
    assert isinstance(grace, int)
    assert grace > k8s_settings.shutdown_timeout_seconds
    assert k8s_settings.shutdown_timeout_seconds == Settings.__dataclass_fields__[
        "shutdown_timeout_seconds"].default


def test_k8s_proxy_resources_and_security() -> None:
    proxy = k8s_container("kafka-quota-proxy")
    assert proxy["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                                  "limits": {"memory": "512Mi"}}
    security = proxy["securityContext"]
    assert security["runAsNonRoot"] is True
    # The image's USER, so the pod does not run the proxy as some other uid by accident.
    assert f"{security['runAsUser']}:{security['runAsGroup']}" == dict(dockerfile_stages()[-1])["USER"]


def test_k8s_sidecar_config_passes_check_config(k8s_config_file: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = check_config(k8s_config_file, capsys)
    assert "quota state shared through redis://valkey:6379" in out
    assert "warning" not in out


def test_k8s_sidecars_take_no_quota_changes_from_their_pods(k8s_settings: Settings) -> None:
    # The application shares the sidecar's loopback, and a change at one sidecar would hold at all.
    policy, warnings = management_policy(k8s_settings)
    assert policy == "quota management: alter by nobody; describe by nobody"
    assert warnings == []
    quotas = validate_quota_entries(k8s_settings.quotas, str(K8S_SIDECAR))
    assert quotas, "the ConfigMap is where the sidecars' quotas come from; it should show one"


def test_k8s_store_url_names_the_valkey_service(k8s_settings: Settings) -> None:
    store = k8s_settings.store
    assert store is not None and not store.cluster
    host, port = valkey_host_port(store.url)
    service_doc, valkey = k8s_kind("Service"), k8s_kind("StatefulSet")
    assert host == service_doc["metadata"]["name"]  # the short name: the same namespace
    (service_port,) = service_doc["spec"]["ports"]
    assert service_port["port"] == port
    pod_labels = valkey["spec"]["template"]["metadata"]["labels"]
    assert service_doc["spec"]["selector"].items() <= pod_labels.items()
    assert valkey["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    container_ports = {p["name"]: p["containerPort"] for p in k8s_valkey_container()["ports"]}
    assert container_ports[service_port["targetPort"]] == VALKEY_PORT
    # Exactly one Valkey, ever: two would each see only the sidecars connected to them.
    assert valkey["spec"]["replicas"] == 1 and valkey["spec"]["serviceName"] == host


def test_k8s_store_password_comes_from_the_secret(k8s_settings: Settings) -> None:
    store = k8s_settings.store
    assert store is not None and store.password_env
    assert urlsplit(store.url).password is None
    secret = k8s_kind("Secret")
    ref = secret_ref(k8s_container("kafka-quota-proxy"), store.password_env)
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret.get("stringData", secret.get("data", {}))
    # Valkey requires the same password, and its probe gives it.
    valkey = k8s_valkey_container()
    (variable,) = [e["name"] for e in valkey["env"] if e["valueFrom"]["secretKeyRef"] == ref]
    args = valkey["args"]
    assert args[0] == "valkey-server" and args[args.index("--requirepass") + 1] == f"$({variable})"
    probe = valkey["readinessProbe"]["exec"]["command"]
    assert probe[:2] == ["sh", "-c"] and f'-a "${variable}" ping' in probe[2]


def test_k8s_valkey_image_and_security() -> None:
    valkey = k8s_valkey_container()
    assert VALKEY_IMAGE.fullmatch(valkey["image"]), valkey["image"]
    assert valkey["image"] == service("valkey")["image"]  # the one the compose demo runs
    security = valkey["securityContext"]
    assert security["runAsNonRoot"] is True and security["readOnlyRootFilesystem"] is True
    # The image's entrypoint refuses to start unless its working directory, /data, is writable.
    (data,) = valkey["volumeMounts"]
    assert data["mountPath"] == "/data" and not data.get("readOnly", False)
    (volume,) = k8s_kind("StatefulSet")["spec"]["template"]["spec"]["volumes"]
    assert volume == {"name": data["name"], "emptyDir": {}}


def test_k8s_quota_state_file_is_on_a_writable_volume(k8s_settings: Settings) -> None:
    # Quotas shared through the store are written to the state file as they arrive; a replica
    # that cannot write it describes them but does not enforce them.
    state = PurePosixPath(str(default_state_file(CONFIG_PATH_IN_CONTAINER, k8s_settings.quota)))
    proxy = k8s_container("kafka-quota-proxy")
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    (mount,) = [m for m in proxy["volumeMounts"] if state.is_relative_to(m["mountPath"])]
    assert not mount.get("readOnly", False)
    (volume,) = [v for v in k8s_pod_spec()["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume
