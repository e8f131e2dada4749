"""The committed protobuf modules are what protoc generates from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_current() -> None:
    """python proto/generate.py --check finds nothing stale."""
    r = subprocess.run([sys.executable, "proto/generate.py", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
