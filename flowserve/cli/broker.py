"""``flowserve broker``: a broker on loopback, kept running until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flowserve.cli import common
from flowserve.kafka.settings import KafkaSettings


def register(sub: Any) -> None:
    p = sub.add_parser("broker", help="start a broker on loopback and keep it running")
    p.add_argument("--kind", choices=["default", "embedded", "kafka"], default="default")
    p.add_argument("--nodes", type=int, default=1, help="Apache Kafka only: 1 or 3 brokers")
    p.add_argument("--port", type=int)
    p.set_defaults(func=cmd_broker)


def cmd_broker(args: argparse.Namespace) -> int:
    from flowserve.kafka.brokers import ApacheKafka, EmbeddedBroker, start_default  # the launchers

    common.stop_on_sigterm()
    if args.kind == "default":
        broker: Any = start_default(port=args.port)
    elif args.kind == "embedded":
        broker = EmbeddedBroker.start(port=args.port)
    else:
        broker = ApacheKafka.start(nodes=args.nodes, port=args.port)

    def announce() -> None:
        print(broker.bootstrap, flush=True)
        if broker.fetch_max_wait_ms != KafkaSettings.model_fields["fetch_max_wait_ms"].default:
            # it answers a fetch only when the fetch's wait ends: clients elsewhere must keep the wait short
            print(f"clients of this broker: export FLOWSERVE_FETCH_MAX_WAIT_MS={broker.fetch_max_wait_ms}",
                  file=sys.stderr, flush=True)
        if broker.supports_transactions:
            print("clients of this broker: export FLOWSERVE_IDEMPOTENCE=1 (idempotent producers)",
                  file=sys.stderr, flush=True)

    try:
        common.wait_for_stop(announce)
    finally:
        broker.stop()
    return 0
