"""Every config shipped in deploy/ and docs/ runs on what the container image installs.

The image installs the project's wheel with the extras its Dockerfile names (today none); a
feature that imports an optional module once configured (config/installed.py) must find it
there. The store's client was once only in the `store` extra, so the image's replicas degraded
at their first sync and the compose demo's two replicas never shared a quota."""

from __future__ import annotations

import re
import shlex
import tempfile
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kafka_quota_proxy.config.installed import needed_modules
from kafka_quota_proxy.config.settings import Settings, load_file, merge
from tests.deploy.test_deploy_files import COMPOSE_REPLICAS, dockerfile_stages, k8s_kind, pyproject
from tests.docs.test_docs import EXAMPLES, _completed

PROJECT = canonicalize_name(pyproject()["project"]["name"])


def image_requirement() -> Requirement:
    """What the image's final stage `pip install`s of the project, with its extras."""
    (run,) = [args for keyword, args in dockerfile_stages()[-1] if keyword == "RUN" and "pip install" in args]
    (spec,) = [t for t in shlex.split(run) if canonicalize_name(re.split(r"[\[=<>~!; ]", t)[0]) == PROJECT]
    return Requirement(spec)


def installed_by(requirement: Requirement, project: dict[str, Any]) -> set[str]:
    """The distributions a pip install of `project` with `requirement`'s extras brings in, one
    level down: each dependency, and the extras it names that are distributions of their own
    (redis[hiredis] brings hiredis)."""
    lines = list(project["dependencies"])
    for extra in requirement.extras:
        lines += project["optional-dependencies"][extra]
    found: set[str] = set()
    for line in lines:
        dep = Requirement(line)
        if dep.marker is not None and not dep.marker.evaluate({"sys_platform": "linux"}):
            continue
        found.add(canonicalize_name(dep.name))
        found |= {canonicalize_name(e) for e in dep.extras}
    return found


def missing_from_image(settings: Settings, project: dict[str, Any]) -> list[str]:
    """What `settings` needs that an image of `project` would not install, one line each."""
    image = installed_by(image_requirement(), project)
    providers = packages_distributions()
    missing = []
    for module, why in needed_modules(settings).items():
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        assert dists, f"{module} is not installed here either"
        if not dists & image:
            missing.append(f"{why} needs {module}, which the image does not install "
                           f"(it installs {image_requirement()}: {sorted(image)})")
    return missing


def shipped_configs() -> list[tuple[str, Settings]]:
    configs = [(str(path.relative_to(path.parents[2])), merge(load_file(path)))
               for path in COMPOSE_REPLICAS.values()]
    configs.append(("deploy/kubernetes/sidecar.yaml (ConfigMap proxy.yaml)",
                    merge(load_file(_written(k8s_kind("ConfigMap")["data"]["proxy.yaml"])))))
    scratch = Path(tempfile.mkdtemp(prefix="kqp-examples-"))
    for where, block in EXAMPLES:
        data = _completed(block, scratch)
        if data is not None:
            configs.append((where, merge(load_file(_written(yaml.safe_dump(data))))))
    return configs


def _written(text: str) -> Path:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, encoding="utf-8") as f:
        f.write(text)
    return Path(f.name)


CONFIGS = shipped_configs()


def test_the_shipped_configs_use_what_needs_an_optional_module() -> None:
    """Else the check below would check nothing: the compose replicas use a store."""
    assert any(needed_modules(settings) for _, settings in CONFIGS)


@pytest.mark.parametrize(("where", "settings"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_the_image_installs_what_a_shipped_config_needs(where: str, settings: Settings) -> None:
    assert missing_from_image(settings, pyproject()["project"]) == [], where


def test_a_module_only_an_extra_brings_is_missing_from_the_image() -> None:
    """The check can fail: the store's client back in a `store` extra the Dockerfile does not
    name, as it was, leaves the compose replicas without it."""
    project = pyproject()["project"]
    moved = {**project, "dependencies": [d for d in project["dependencies"] if not d.startswith("redis")],
             "optional-dependencies": {**project["optional-dependencies"], "store": ["redis[hiredis]>=8.0"]}}
    (replica, settings) = CONFIGS[0]
    assert settings.store is not None, replica
    (line,) = missing_from_image(settings, moved)
    assert line.startswith("the quota store's client (store:, workers) needs redis, which the image "
                           "does not install (it installs kafka-quota-proxy: [")
