"""verl's warnings that repeat for every sample, logged once per process.

verl's agent loop picks a "Continuous Token builder" for each sample from the model's
``model_type`` and warns, at every sample, when it has none for it (a Llama such as
SmolLM2, conf/cpu's model: 480 of a 40-step CPU run's 1,750 log lines; on GPUs, a line per
sample of every step). The fallback is verl's default builder, which every CPU run so far
learned with; the warning says nothing new after its first time.

verl's plugin hook (``VERL_USE_EXTERNAL_MODULES``, :func:`~rl_pipeline.engines.verl.config.
external_modules_override`) imports this module inside ``import verl`` in every Ray process
of every run, so it imports nothing but :mod:`logging`, and installs itself.
"""

from __future__ import annotations

import logging

# verl's loggers whose every distinct message is worth its first time only.
REPEATING = ("verl.utils.tokenizer.continuous_token_wiring",)


class OncePerProcess(logging.Filter):
    """Passes each distinct message (its template and arguments) of a logger once."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self._seen:
            return False
        self._seen.add(message)
        return True


def install() -> None:
    """Put :class:`OncePerProcess` on each of :data:`REPEATING` (once, however often called)."""
    for name in REPEATING:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OncePerProcess) for f in logger.filters):
            logger.addFilter(OncePerProcess())


install()
