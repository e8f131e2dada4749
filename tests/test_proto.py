"""The committed protobuf modules are what protoc generates from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_is_current() -> None:
    """python -m proto.generate --check finds nothing stale."""
    r = subprocess.run([sys.executable, "-m", "proto.generate", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
