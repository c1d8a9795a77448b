"""Generated two-number additions as raw records: a task a 135M model can learn on a CPU.

GSM8K is out of reach of SmolLM2-135M in a few CPU minutes (greedy accuracy about 2%, and
about 0 sampled, so GRPO groups carry no correctness signal), while "What is 57 + 26?" is
answered right about a quarter of the time: enough correct samples to reinforce. The records
have GSM8K's shape (``question``, and an ``answer`` ending in ``#### <sum>``), so the same
data_prep, reward and metrics apply unchanged; with ``answer_format: boxed`` they end in
``\\boxed{<sum>}`` instead, MATH's form, which the MATH scorer (math-verify) reads.

The problems are generated, not stored: every ordered pair ``(a, b)`` of operands in
``operands`` is put in one seeded order, ``train`` takes pairs from the front and ``test``
from the back, each at most half of them, so the splits never share a pair.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from kedro.io import AbstractDataset, DatasetError

from rl_pipeline.data.records import RawRecords

# How an answer ends: GSM8K's "#### <sum>", or MATH's "\boxed{<sum>}".
ANSWER_FORMATS = {"gsm8k": "{a} + {b} = {s}\n#### {s}", "boxed": "{a} + {b} = \\boxed{{{s}}}"}


def addition_records(split: Literal["train", "test"], rows: int, seed: int = 0,
                     operands: tuple[int, int] = (10, 99),
                     answer_format: Literal["gsm8k", "boxed"] = "gsm8k",
                     ) -> list[dict[str, str]]:
    """``rows`` additions ``a + b`` with ``a, b`` in ``operands`` (inclusive), answered in
    ``answer_format`` (:data:`ANSWER_FORMATS`).

    Raises:
        ValueError: On an unknown split, or more rows than half the pairs.
    """
    low, high = operands
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r}: expected 'train' or 'test'")
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    if not 0 < rows <= len(pairs) // 2:
        raise ValueError(f"rows={rows}: expected 1 to {len(pairs) // 2} (half of the "
                         f"{len(pairs)} pairs of operands {low}-{high}, so that train and test "
                         "share none)")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format={answer_format!r}: expected one of "
                         f"{', '.join(ANSWER_FORMATS)}")
    random.Random(seed).shuffle(pairs)
    chosen = pairs[:rows] if split == "train" else pairs[::-1][:rows]
    return [{"question": f"What is {a} + {b}?",
             "answer": ANSWER_FORMATS[answer_format].format(a=a, b=b, s=a + b)}
            for a, b in chosen]


class AdditionDataset(AbstractDataset[None, RawRecords]):
    """Read-only raw records of :func:`addition_records`, numbered as rows.

    Example::

        raw_train:
          type: rl_pipeline.datasets.arithmetic.AdditionDataset
          split: train
          rows: 600
          seed: 0
    """

    def __init__(self, *, split: Literal["train", "test"], rows: int, seed: int = 0,
                 operands: tuple[int, int] | list[int] = (10, 99),
                 answer_format: Literal["gsm8k", "boxed"] = "gsm8k",
                 metadata: dict[str, Any] | None = None) -> None:
        self._split, self._rows, self._seed = split, rows, seed
        self._operands = (int(operands[0]), int(operands[1]))
        self._answer_format = answer_format
        self.metadata = metadata

    def load(self) -> RawRecords:
        try:
            records = addition_records(self._split, self._rows, self._seed, self._operands,
                                       self._answer_format)
        except ValueError as exc:
            raise DatasetError(f"{type(self).__name__}: {exc}") from None
        return RawRecords(source=f"generated additions [{self._split}, seed {self._seed}]",
                          records=records, lines=list(range(1, len(records) + 1)), unit="row")

    def save(self, data: Any) -> None:
        raise DatasetError(f"{type(self).__name__} is read-only")

    def _exists(self) -> bool:
        return True  # generated on load, never missing (Kedro's default warns instead)

    def _describe(self) -> dict[str, Any]:
        return {"split": self._split, "rows": self._rows, "seed": self._seed,
                "operands": self._operands, "answer_format": self._answer_format}
