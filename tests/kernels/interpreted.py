"""Run a script that launches Triton kernels under the interpreter, in a fresh process.

Triton reads ``TRITON_INTERPRET`` when it is first imported, and the test process may already
have imported it without the variable, so interpreted launches need their own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def run_interpreted(script: str, outputs: Path):
    """Run ``script`` with TRITON_INTERPRET=1 and return what it saved to ``outputs``."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(outputs)
