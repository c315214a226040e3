"""flowserve ui checks plain bearer tokens only: given a scoped token file it refuses to start, rather than
serve the page with no authentication."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ui_refuses_a_scoped_token_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {name: a, token: s3cret-value, models: [digits], actions: [infer]}\n")
    done = subprocess.run([sys.executable, "-m", "flowserve", "ui", str(REPO / "topologies" / "digits.yaml"),
                           "--token-file", str(tokens), "--broker", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "flowserve ui takes unscoped tokens only" in done.stderr + done.stdout
    assert "s3cret-value" not in done.stderr + done.stdout
