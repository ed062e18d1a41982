"""The Spark session the pipeline runs in, and this code shipped to Spark's Python workers.

Run from plain Python, the pipeline starts its own JVM: `local[*]` unless `--master` says
otherwise. Run by spark-submit (which starts the JVM first), it takes the master and the rest of
the configuration from spark-submit and adds nothing but what it must.

The replay runs `analytics` and `quota` code inside Spark's Python workers, which on a cluster
do not have this package installed; so both packages are zipped and added to the session
(`addPyFile`), the same as `spark-submit --py-files`.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

_SHIPPED = "spark.kafka_quota_proxy.code_shipped"
SHIPPED_PACKAGES = ("kafka_quota_proxy.analytics", "kafka_quota_proxy.quota", "kafka_quota_proxy.config")


def is_local(master: str | None) -> bool:
    return master is None or master.startswith("local")


def start(master: str | None = None, conf: Mapping[str, str] | None = None,
          app_name: str = "kafka-quota-proxy analyze") -> tuple[SparkSession, bool]:
    """The active session, or a new one; the flag says whether this call created it (and so
    should stop it)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        ship_code(active)
        return active, False
    builder = SparkSession.builder.appName(app_name)
    launching = "PYSPARK_GATEWAY_PORT" not in os.environ  # not under spark-submit
    if master is None and launching:
        master = "local[*]"
    if launching and is_local(master) and "PYSPARK_PYTHON" not in os.environ:
        # The workers must be this interpreter, which has pandas and pyarrow. PySpark takes the
        # workers' interpreter from this variable when the context starts.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    if master is not None:
        builder = builder.master(master)
    for key, value in _defaults(master, launching).items():
        builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ship_code(spark)
    return spark, True


def _defaults(master: str | None, launching: bool) -> dict[str, str]:
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    if launching and is_local(master):
        cores = _local_cores(master)
        conf.update({
            "spark.ui.enabled": "false",
            # The driver is the executor too; 1g (Spark's default) is tight for a week of records.
            "spark.driver.memory": "2g",
            # Few cores: not 200 partitions per shuffle, but enough that a partition of a week of
            # records stays small; adaptive execution merges the small ones.
            "spark.sql.shuffle.partitions": str(max(8, 8 * cores)),
        })
    return conf


def _local_cores(master: str | None) -> int:
    inside = (master or "local[*]").partition("[")[2].partition("]")[0].partition(",")[0]
    return int(inside) if inside.isdigit() else (os.cpu_count() or 1)


def ship_code(spark: SparkSession) -> None:
    """Zip the packages the workers need and add the zip to the session, once per session."""
    if spark.conf.get(_SHIPPED, "false") == "true":
        return
    spark.sparkContext.addPyFile(str(_zip_packages()))
    spark.conf.set(_SHIPPED, "true")


def _zip_packages() -> Path:
    # Spark serves the file from here for the session's life; gone when this process ends.
    directory = tempfile.mkdtemp(prefix="kqp-analytics-")
    atexit.register(shutil.rmtree, directory, True)
    target = Path(directory) / "kafka_quota_proxy_analytics.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        top = importlib.import_module(SHIPPED_PACKAGES[0].partition(".")[0])
        zf.write(top.__file__ or "", f"{top.__name__}/__init__.py")
        for package in SHIPPED_PACKAGES:
            source = Path(importlib.import_module(package).__file__ or "").resolve().parent
            for path in sorted(source.rglob("*.py")):
                zf.write(path, (Path(*package.split(".")) / path.relative_to(source)).as_posix())
    return target
