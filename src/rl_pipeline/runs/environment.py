"""Environment variables set for a block and put back after it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Each of ``values`` set in the environment for the block (where the processes the
    block starts see it too), then as it was, so that a second command in the same process
    (a notebook, a test) starts clean."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
