"""The soak's kafka-python producer alone, through the proxy, under the soak's quota cycle: 100
records/s (about 53 KB/s) held to 24 KiB/s for 30 s of every 60 (the config file's `quotas:`
rewritten every 30 s, as in the soak). Every 5 s it prints what was sent and acknowledged, how
long the oldest unacknowledged record has waited, the longest wait for an acknowledgement so
far, and the delivery errors; kafka-python's warnings (throttles, request timeouts, retries) go
to the log file. It measures what the cycle's backlog costs against kafka-python's 120 s
delivery timeout (docs/reliability.md, "Soak").

    python -m devkit.soak.quota_cycle --seconds 240 [--log quota-cycle.log]
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from devkit.processes import ProxyProcess
from devkit.soak.disturbers import ConfigRewriter
from devkit.soak.run import PARTITIONS, TOPIC, YAML_VARIANTS
from devkit.soak.workload import KafkaPythonProducer, Ledger, stop_all
from devkit.tansu import Broker

CLIENT_ID = "soak-kafka-python"  # the client-id the soak's YAML quota names
RATE = 100.0  # records a second, as in the soak
EVERY = 30.0  # seconds between rewrites of the quotas, as in a soak of 30 minutes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--log", type=Path, default=Path("quota-cycle.log"))
    args = parser.parse_args()
    handler = logging.FileHandler(args.log, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("kafka")
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    logger.propagate = False
    broker = Broker().start()
    proxy = ProxyProcess(broker.address, broker.node_id(), extra_config={"quotas": YAML_VARIANTS[0]})
    try:
        proxy.start()
        assert proxy.config_path is not None
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        ledger = Ledger()
        producer = KafkaPythonProducer(proxy.bootstrap, TOPIC, CLIENT_ID, 3, RATE, ledger)
        rewriter = ConfigRewriter(proxy.config_path, YAML_VARIANTS, EVERY)
        start = time.monotonic()
        first_unacked = 0
        producer.start()
        rewriter.start()
        while (elapsed := time.monotonic() - start) < args.seconds:
            time.sleep(5.0 - elapsed % 5.0)
            elapsed = time.monotonic() - start
            low = int(elapsed // EVERY) % 2 == 0
            acked, sent = ledger.count(), producer.sent
            while first_unacked < sent and (3 << 56 | first_unacked) in ledger.acked:
                first_unacked += 1
            # Record n was sent n / RATE seconds in (the producer is paced).
            oldest = elapsed - first_unacked / RATE if first_unacked < sent else 0.0
            print(f"{elapsed:6.1f} s  quota {'24 KiB/s' if low else '1 MiB/s '}  sent {sent:6d}  "
                  f"acked {acked:6d}  oldest waiting {oldest:5.1f} s  longest wait "
                  f"{producer.longest_wait:5.1f} s  errors {len(ledger.errors)}", flush=True)
        stop_all([rewriter], 10.0)
        rewriter.write(YAML_VARIANTS[1])  # lifted, so that the backlog drains before the end
        stop_all([producer], 90.0)
        print(f"longest wait for an acknowledgement {producer.longest_wait:.1f} s; "
              f"{ledger.count()} of {producer.sent} acknowledged; failures: "
              + ("; ".join(str(f) for f in ledger.errors) or "none"), flush=True)
    finally:
        proxy.stop()
        broker.stop()
        logger.removeHandler(handler)
        handler.close()


if __name__ == "__main__":
    main()
