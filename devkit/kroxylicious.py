"""Kroxylicious, the peer proxy, built from its own source and run in passthrough for side-by-side
benchmarks (issue 39, `bench.kafka_paths`). Outside `make test`.

Kroxylicious 0.23.0 is not served by the Maven registry reachable here, so it is built from a git
repository that has its tag v0.23.0 (`--source`, or $KROXYLICIOUS_SOURCE: a clone or a bare git
directory; nothing of theirs is committed here). The build, once, into
~/.cache/kafka-quota-proxy/kroxylicious-0.23.0/ (beside Kafka's jars):

- Maven 3.9 (their plugins refuse Debian's 3.8.7): `org.apache.maven:apache-maven:3.9.9`,
  classifier `bin`, type `tar.gz`, fetched from the Maven registry by the system's mvn;
- a JDK of 21 or later (`--java-home`, $KROXYLICIOUS_JAVA_HOME, or the newest under
  /usr/lib/jvm);
- the tag's source with the modules whose BOMs are not served taken out of the root pom
  (kroxylicious-kubernetes, kroxylicious-openmessaging-benchmarks, kroxylicious-docs) and
  kroxylicious-app's test-scoped dependencies dropped;
- `mvn -pl kroxylicious-app -am package -DwithAdditionalFilters=false -Dmaven.test.skip=true
  -Dmaven.gitcommitid.skip=true` (about 4 minutes on 2 cores once the dependencies are in
  ~/.m2), then the app's runtime jars copied into lib/.

Run: `io.kroxylicious.app.Kroxylicious -c config.yaml` with one virtual cluster in front of the
target, a `portIdentifiesNode` gateway: the bootstrap port, then the broker's node id alone in
`nodeIdRanges`, on the port after it.

    python -m devkit.kroxylicious build --source /path/to/kroxylicious
    python -m devkit.kroxylicious run --target 127.0.0.1:9092 --port 9192
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from devkit.kafka_jvm import LOOPBACK, end, free_port, java_version, tail_of
from devkit.processes import die_with_parent, is_free, log_tail, wait_for_port

VERSION = "0.23.0"
TAG = f"v{VERSION}"
MAVEN = "3.9.9"
MIN_JAVA = 21
MAIN_CLASS = "io.kroxylicious.app.Kroxylicious"
# Modules whose BOMs the reachable registry does not serve, or that the app does not need.
DROPPED_MODULES = ("kroxylicious-kubernetes", "kroxylicious-openmessaging-benchmarks", "kroxylicious-docs")
BUILT = ".built"  # in the cache folder: the tag it was built from, once lib/ is complete


class KroxyliciousError(RuntimeError):
    """Kroxylicious could not be built or started; the message says why."""


def cache_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kafka-quota-proxy" / f"kroxylicious-{VERSION}"


def lib_dir() -> Path | None:
    """The built jars, or None when not built yet."""
    done = cache_dir() / BUILT
    if done.is_file() and done.read_text().strip() == TAG:
        return cache_dir() / "lib"
    return None


def find_java_home(given: str | None = None) -> Path:
    """A JDK of MIN_JAVA or later: `given`, $KROXYLICIOUS_JAVA_HOME, or the newest under
    /usr/lib/jvm."""
    candidates = [Path(p) for p in (given, os.environ.get("KROXYLICIOUS_JAVA_HOME")) if p]
    if not candidates:
        jvm = Path("/usr/lib/jvm")
        candidates = sorted((p for p in jvm.iterdir() if (p / "bin" / "javac").is_file()), reverse=True) \
            if jvm.is_dir() else []
    best: tuple[int, Path] | None = None
    for home in candidates:
        java = home / "bin" / "java"
        if not java.is_file():
            continue
        version = java_version(str(java))
        if version >= MIN_JAVA and (best is None or version > best[0]):
            best = (version, home)
    if best is None:
        raise KroxyliciousError(f"no JDK {MIN_JAVA} or later (Kroxylicious {VERSION} needs one): pass "
                                "--java-home or set KROXYLICIOUS_JAVA_HOME")
    return best[1]


def _run(cmd: Sequence[str], what: str, timeout: float, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> str:
    out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        tail = tail_of(out.stdout + out.stderr, 30)
        raise KroxyliciousError(f"{what} failed (exit {out.returncode}):\n{tail}")
    return out.stdout


def maven_home(into: Path) -> Path:
    """Maven MAVEN's binary distribution, fetched from the Maven registry by the system's mvn and
    unpacked into `into`."""
    home = into / f"apache-maven-{MAVEN}"
    if (home / "bin" / "mvn").is_file():
        return home
    mvn = shutil.which("mvn")
    if not mvn:
        raise KroxyliciousError("no mvn: fetching Maven 3.9 needs Maven on the PATH (apt-get install maven)")
    into.mkdir(parents=True, exist_ok=True)
    _run([mvn, "-B", "-q", "dependency:copy",
          f"-Dartifact=org.apache.maven:apache-maven:{MAVEN}:tar.gz:bin", f"-DoutputDirectory={into}"],
         f"fetching Maven {MAVEN}", timeout=600, cwd=into)
    archive = into / f"apache-maven-{MAVEN}-bin.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return home


def checkout(source: Path, into: Path) -> Path:
    """The tag's tree from the git repository `source`, exported into `into`/src."""
    if shutil.which("git") is None:
        raise KroxyliciousError("no git: the source is read from a git repository")
    src = into / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    git_dir = source / ".git" if (source / ".git").exists() else source
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", TAG], capture_output=True,
                             timeout=300, stdin=subprocess.DEVNULL)
    if archive.returncode != 0:
        raise KroxyliciousError(f"{source} has no tag {TAG} (git archive: "
                                f"{archive.stderr.decode(errors='replace').strip()})")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True, timeout=300)
    return src


def trim(src: Path) -> None:
    """Take out of the root pom the modules DROPPED_MODULES names, and out of the app's pom its
    test-scoped dependencies (their artifacts are not served here)."""
    root = src / "pom.xml"
    text = root.read_text()
    for module in DROPPED_MODULES:
        text, n = re.subn(rf"\s*<module>{re.escape(module)}</module>", "", text)
        if n == 0:
            raise KroxyliciousError(f"{root} lists no module {module}: not the layout of {TAG}")
    root.write_text(text)
    app = src / "kroxylicious-app" / "pom.xml"
    dependency = re.compile(r"\s*<dependency>(?:(?!</dependency>).)*?<scope>test</scope>"
                            r"(?:(?!</dependency>).)*?</dependency>", re.S)
    app.write_text(dependency.sub("", app.read_text()))


def build(source: Path, java_home: str | None = None) -> Path:
    """Build Kroxylicious TAG from `source` into cache_dir()/lib, unless it is there already."""
    found = lib_dir()
    if found is not None:
        return found
    home = find_java_home(java_home)
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    mvn = maven_home(cache) / "bin" / "mvn"
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    try:
        src = checkout(source, work)
        trim(src)
        path = f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}"
        env = {**os.environ, "JAVA_HOME": str(home), "PATH": path}
        flags = ["-B", "-q", "-DwithAdditionalFilters=false", "-Dmaven.test.skip=true",
                 "-Dmaven.gitcommitid.skip=true"]
        # One reactor run: the app's own modules resolve from it (they are on no registry here).
        # Every module of the run copies its runtime jars into lib/, all of them the app's.
        lib = work / "lib"
        _run([str(mvn), *flags, "-pl", "kroxylicious-app", "-am", "package", "dependency:copy-dependencies",
              f"-DoutputDirectory={lib}", "-DincludeScope=runtime"],
             f"building Kroxylicious {VERSION} (mvn package)", timeout=3600, cwd=src, env=env)
        app = src / "kroxylicious-app" / "target" / f"kroxylicious-app-{VERSION}.jar"
        if not app.is_file():
            raise KroxyliciousError(f"the build made no {app.name}")
        shutil.copy2(app, lib)
        (lib / "JAVA_HOME").write_text(f"{home}\n")
        final = cache / "lib"
        shutil.rmtree(final, ignore_errors=True)
        lib.rename(final)
        (cache / BUILT).write_text(TAG + "\n")
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def config(target: str, port: int, node_id: int = 1, host: str = LOOPBACK) -> str:
    """One virtual cluster in front of `target`, passthrough (no filters), a portIdentifiesNode
    gateway on `port` for the broker `node_id` alone (on `port` + 1)."""
    return (f"virtualClusters:\n"
            f"  - name: bench\n"
            f"    targetCluster:\n"
            f"      bootstrapServers: {target}\n"
            f"    gateways:\n"
            f"    - name: plain\n"
            f"      portIdentifiesNode:\n"
            f"        bootstrapAddress: {host}:{port}\n"
            f"        nodeIdRanges:\n"
            f"        - name: broker\n"
            f"          start: {node_id}\n"
            f"          end: {node_id}\n"
            f"    logNetwork: false\n"
            f"    logFrames: false\n")


def free_ports(count: int = 2) -> int:
    """A port free with the `count` - 1 after it (the gateway's bootstrap, then its nodes')."""
    for _ in range(100):
        first = free_port()
        if all(is_free(first + i) for i in range(1, count)):
            return first
    raise KroxyliciousError(f"no {count} free ports in a row")


def command(lib: Path, config_file: Path, heap: str = "1g") -> list[str]:
    java_home = Path((lib / "JAVA_HOME").read_text().strip())
    return [str(java_home / "bin" / "java"), f"-Xmx{heap}", "-cp", f"{lib}{os.sep}*", MAIN_CLASS,
            "-c", str(config_file)]


class Running:
    """A started Kroxylicious: its process and its log."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, port: int) -> None:
        self.proc, self.log, self.port = proc, log, port

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def stop(self, timeout: float = 20.0) -> None:
        end(self.proc, timeout)


def start(target: str, port: int, workdir: Path, lib: Path | None = None, node_id: int = 1) -> Running:
    """Kroxylicious in front of `target` (whose broker is `node_id`), listening on `port` and
    `port` + 1 (free_ports()); returns once its bootstrap port accepts connections."""
    lib = lib or lib_dir()
    if lib is None:
        raise KroxyliciousError(f"Kroxylicious {VERSION} is not built: python -m devkit.kroxylicious build "
                                "--source GIT_DIR")
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "kroxylicious.yaml"
    config_file.write_text(config(target, port, node_id))
    log = workdir / "kroxylicious.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command(lib, config_file), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=workdir, preexec_fn=die_with_parent)
    running = Running(proc, log, port)
    try:
        wait_for_port(port, timeout=90.0, proc=proc)
    except (RuntimeError, TimeoutError) as exc:
        running.stop()
        raise KroxyliciousError(f"Kroxylicious did not listen on {port} ({exc}):\n{log_tail(log)}") from None
    return running


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devkit.kroxylicious", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build", help=f"build Kroxylicious {VERSION} from a git repository with tag {TAG}")
    b.add_argument("--source", default=os.environ.get("KROXYLICIOUS_SOURCE"),
                   help="a clone or bare git directory of Kroxylicious (or $KROXYLICIOUS_SOURCE)")
    b.add_argument("--java-home",
                   help=f"a JDK {MIN_JAVA}+ (default: $KROXYLICIOUS_JAVA_HOME, or /usr/lib/jvm's newest)")
    r = sub.add_parser("run", help="run the built Kroxylicious in front of a broker until Ctrl-C")
    r.add_argument("--target", required=True, help="the broker's bootstrap address, host:port")
    r.add_argument("--port", type=int, default=9192, help="the bootstrap port; the broker's is the next")
    r.add_argument("--node-id", type=int, default=1, help="the target broker's node id")
    args = ap.parse_args(argv)
    try:
        if args.what == "build":
            if not args.source:
                ap.error("--source (or $KROXYLICIOUS_SOURCE) is needed: "
                         "no copy of their repository is kept here")
            print(build(Path(args.source), args.java_home))
            return 0
        workdir = Path(tempfile.mkdtemp(prefix="kroxylicious-"))
        running = start(args.target, args.port, workdir, node_id=args.node_id)
        print(f"Kroxylicious on {running.bootstrap} in front of {args.target}; log {running.log}")
        try:
            running.proc.wait()
        except KeyboardInterrupt:
            pass
        finally:
            running.stop()
        return 0
    except KroxyliciousError as exc:
        print(f"kroxylicious: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
