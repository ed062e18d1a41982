"""`python -m kafka_quota_proxy.analytics analyze|generate-usage ...`, and the file spark-submit runs:

    spark-submit --master yarn --driver-memory 4g \\
        "$(python -c 'import kafka_quota_proxy.analytics as a; print(a.__path__[0])')/__main__.py" \\
        analyze --usage hdfs:///kqp/usage --out /shared/kqp-report

spark-submit runs this file as a script, outside its package; the directory holding
`kafka_quota_proxy` is then put on the path so that the package imports (and the session ships
them to the executors itself).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from kafka_quota_proxy.analytics.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
