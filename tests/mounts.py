"""Small file systems for fault tests: a full disk, a read-only folder.

A tmpfs of a few megabytes fills up for real, and a read-only remount refuses writes even to
root (who ignores a folder's mode bits, and whom CI runs as). Mounting needs root or
CAP_SYS_ADMIN; without it the tests that need a mount are skipped, saying why.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. "8m") on ``path`` for the duration."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fill(path: Path) -> None:
    """Write zeros into ``path`` until its file system is full."""
    block = bytes(1 << 16)
    try:
        with (path / ".filler").open("wb", buffering=0) as filler:
            while True:
                filler.write(block)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
