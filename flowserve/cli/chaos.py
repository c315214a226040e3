"""``flowserve bench chaos`` options (the run itself: :mod:`flowserve.bench.chaos`)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=10.0, help="chaos: how long traffic and faults go on")
    p.add_argument("--nodes", type=int, choices=[1, 3], default=1,
                   help="chaos: Apache Kafka nodes (3: replicated topics, and broker kills join the faults)")
    p.add_argument("--seed", type=int, default=17, help="chaos: seed of the fault schedule")
    p.add_argument("--chaos-rate", type=float, default=20.0,
                   help="chaos: requests per second from each caller (HTTP and async)")
    p.add_argument("--gateways", type=int, choices=[1, 2, 3, 4], default=2,
                   help="chaos: gateway processes sharing the HTTP port (SO_REUSEPORT), restarted one at a time; "
                   "with 1, calls are refused while it restarts")
    p.add_argument("--fault-every", type=float, default=20.0, help="chaos: mean seconds between faults")
    p.add_argument("--pause-broker", action=argparse.BooleanOptionalAction, default=True,
                   help="chaos with --nodes 3: also freeze a broker node (SIGSTOP) for seconds (default: on)")
