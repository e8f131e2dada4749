"""``make soak`` keeps working: its fault loops run a few rounds, kill
writers and consumers, and find no violation."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_short_soak_runs_clean(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tests.soak", "--minutes", "0.1", "--dir", str(tmp_path),
         "--seed", "7"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"rounds (\d+), kills (\d+), violations (\d+)", r.stdout)
    assert m is not None, r.stdout
    rounds, kills, violations = map(int, m.groups())
    assert rounds >= 2 and kills >= 1 and violations == 0, r.stdout
