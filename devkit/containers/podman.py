"""Podman from Python, for `make containers` and `make compose-demo`: each call one `podman`
command, its failure a ContainerError with podman's own words."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/kafka-quota-proxy:dev"


class ContainerError(RuntimeError):
    """A podman command failed or a container did not do what it should; the message says which."""


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise ContainerError("podman is not installed: run devkit/containers/setup.sh (as root)") from None
    except subprocess.TimeoutExpired:
        raise ContainerError(f"podman {' '.join(args[:3])} ... not done within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        raise ContainerError(f"podman {' '.join(args)} exited with {done.returncode}:\n"
                             f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done


def inspect(name: str) -> dict[str, Any]:
    found = json.loads(podman("inspect", name).stdout)
    assert isinstance(found, list) and found
    return dict(found[0])


def image_size(image: str = IMAGE) -> int:
    return int(podman("image", "inspect", image, "--format", "{{.Size}}").stdout.strip())


def build_image(image: str = IMAGE, no_cache: bool = False) -> float:
    """`podman build` of the repository's own Dockerfile, unchanged; the seconds it took."""
    started = time.monotonic()
    podman("build", "--pull=never", *(["--no-cache"] if no_cache else []), "-t", image,
           "-f", str(REPO / "Dockerfile"), str(REPO), timeout=1200)
    return time.monotonic() - started


def remove(*names: str) -> None:
    """Force-remove containers, if they exist."""
    for name in names:
        podman("rm", "--force", "--time", "5", name, check=False)


def logs(name: str) -> str:
    done = podman("logs", name, check=False)
    return done.stdout + done.stderr
