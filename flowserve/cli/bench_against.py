"""The options of ``flowserve bench gateway --against URL`` (flowserve's gateway against another V2 server)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--against", metavar="URL",
                   help="gateway: compare with the V2 server at URL (e.g. MLServer), the same load on both")
    p.add_argument("--against-model", metavar="NAME",
                   help="gateway --against: the model to call there (default: the topology's name)")
    p.add_argument("--topology", action="append", metavar="FILE",
                   help="gateway --against: topology to deploy (repeatable; default digits-fused and digits)")
    p.add_argument("--levels", help="gateway --against: closed-loop concurrency levels (default 1,8,32,128)")
    p.add_argument("--rates", help="gateway --against: open-loop Poisson rates in req/s, e.g. 200,800 (default none)")
    p.add_argument("--brokers", help="gateway --against: run on each of these broker kinds in turn, e.g. "
                                     "embedded,kafka (default: the one --broker/--broker-kind gives)")
    p.add_argument("--gateway-processes", type=int, default=1,
                   help="gateway --against: flowserve gateway processes sharing the port (default 1)")
    p.add_argument("--warm-max-seconds", type=float, default=90.0, metavar="S",
                   help="gateway --against: before the first level, drive both sides in turn until the broker's "
                        "JIT compiler is quiet, for at most S seconds (default 90; 0: no such warm-up)")
