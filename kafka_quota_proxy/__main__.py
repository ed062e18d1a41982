"""`python -m kafka_quota_proxy`: the same as the `kafka-quota-proxy` command."""

import sys

from kafka_quota_proxy.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
