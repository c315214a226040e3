"""``flowserve train``: train and cache the bundled models (the component library's), printing accuracy."""

from __future__ import annotations

import argparse
from typing import Any

from flowserve.component import import_library


def register(sub: Any) -> None:
    p = sub.add_parser("train", help="train and cache the bundled models (digits), printing held-out accuracy")
    p.add_argument("models", nargs="*")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    import_library("flowserve_components.models").train_all(args.models or None)
    return 0
