"""What nvidia-smi says of this machine's GPUs (engine-neutral: the verl preflight's driver
check and the forecast's GPU kind both ask)."""

from __future__ import annotations

import shutil
import subprocess


def nvidia_smi_query(field: str) -> str | None:
    """The first GPU's ``field`` as ``nvidia-smi --query-gpu`` gives it (``name``,
    ``driver_version``), or None where there is no nvidia-smi or it fails (no driver
    loaded)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.strip() for line in out.splitlines() if line.strip()), None)
