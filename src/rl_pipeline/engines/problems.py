"""What a preflight reports: each failed check names the parameter, its value and what is
allowed, and all of them are raised together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_pipeline.params import ConfigError


@dataclass(frozen=True)
class Problem:
    """One failed check: the parameter (in ``group``), its value and what is allowed; with no
    parameter, a rule over the group's settings that a library words (``allowed``)."""

    parameter: str
    value: Any
    allowed: str
    group: str = "train.verl"

    def __str__(self) -> str:
        if not self.parameter:
            return f"{self.group}: {self.allowed}"
        return f"{self.group}.{self.parameter}={self.value!r}: {self.allowed}"


class PreflightError(ConfigError):
    """The configuration would fail where it trains; the message lists every problem."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(f"train preflight: {len(problems)} problem(s):\n"
                         + "\n".join(f"  - {p}" for p in problems))


def model_code_problem(exc: Exception, function_name: str) -> Problem:
    """The preflights' problem for a reward that would run model code on this machine
    (:class:`~rl_pipeline.rewards.self_test.ModelCodeOnHostError`), on the reward's name."""
    return Problem("name", function_name, str(exc), group="reward.custom_reward_function")
