"""`python -m analytics analyze|generate-usage ...`, and the file spark-submit runs:

    spark-submit --master yarn --driver-memory 4g \\
        "$(python -c 'import analytics, os; print(os.path.dirname(analytics.__file__))')/__main__.py" \\
        analyze --usage hdfs:///kqp/usage --out /shared/kqp-report

spark-submit runs this file as a script, outside its package; the package's parent directory is
then put on the path so that `analytics`, `quota` and `config` import (and the session ships
them to the executors itself).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
