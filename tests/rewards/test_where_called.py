"""Every built-in reward scores right where the trainers call it, within its time limit.

verl's reward loop calls the reward on an executor thread (``loop.run_in_executor`` in its
``NaiveRewardManager``, which ours extends), TRL on its main thread, eval in the stage's
process. math-verify's own time limits are SIGALRM-based and raise off the main thread, so
the MATH scorer scored every verl sample 0 until its limit moved into a worker process
(:mod:`rl_pipeline.rewards.isolation`). A Ray actor is tested with verl's CPU run
(tests/engines/verl/test_cpu.py).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rl_pipeline.engines.verl.checks import reward_sample
from rl_pipeline.engines.verl.config import compose_verl_config, reward_overrides
from rl_pipeline.params import RewardParams
from rl_pipeline.rewards import build_reward, compute_score, math_verify_score
from rl_pipeline.rewards.isolation import RewardRaised
from rl_pipeline.rewards.sandbox import sandbox_problem
from rl_pipeline.rewards.scoring import BUILTIN
from rl_pipeline.training_rollouts import PREFIX

# Each built-in reward: a data source it scores, a right and a wrong response, the truth.
CASES = {
    "compute_score": ("math", r"So it is \boxed{\frac{1}{2}}.", r"So it is \boxed{2}.",
                      r"\frac{1}{2}"),
    "strict_gsm8k": ("openai/gsm8k", "24 + 48 = 72\n#### 72", "24 + 48 = 70\n#### 70", "72"),
    "flexible_gsm8k": ("openai/gsm8k", "24 + 48 is 72.", "24 + 48 is 70.", "72"),
    "math_verify_score": ("math", r"\boxed{0.5}", r"\boxed{\frac{1}{3}}", r"\frac{1}{2}"),
    "gsm8k_format_credit": ("openai/gsm8k", "24 + 48 = 72\n#### 72", "24 + 48\n#### 70",
                            "72"),
    "exact_match": ("exact_match", "It is in France.\nAnswer: Paris.", "Answer: Lyon",
                    "paris"),
    "choice": ("choice", "Paris is in France, so (b).", "So the answer is A.", "B"),
    "well_formed": ("openai/gsm8k", "24 + 48 = 72\n#### 72", "#### 72\n#### 70", "72"),
    "code_tests": ("code_tests", "```python\ndef add(a, b):\n    return a + b\n```",
                   "```python\ndef add(a, b):\n    return a - b\n```",
                   "assert add(1, 2) == 3"),
    "regex": ("tickets", "The customer wants money back.\nLabel: refund", "Label: billing",
              "Refund"),
}
# The groups a built-in reward is made from, beyond its name.
SETTINGS = {"regex": {"regex": {"pattern": r"Label:\s*(?P<answer>\w+)",
                                "example": "Label: {answer}"}}}
# A reward of two weighted terms: correctness and a small format credit.
TERMS = {"terms": [{"name": "compute_score", "label": "correct"},
                   {"name": "well_formed", "weight": 0.1, "label": "format"}]}
SCORE_ONE = "def score(*args, **kwargs):\n    return 1.0\n"
HANG = """
def score(data_source, solution_str, ground_truth, extra_info=None):
    while "hang" in solution_str:
        pass
    return 1.0
"""


def test_the_cases_cover_every_builtin_reward() -> None:
    # The judge needs an endpoint: its call paths are in tests/rewards/test_judge.py.
    assert set(CASES) | {"judge"} == set(BUILTIN)


def test_the_math_scorer_scores_off_the_main_thread() -> None:
    """On a thread, as verl's reward loop calls it: 1.0, not a ValueError from SIGALRM."""
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(compute_score, "math", r"\boxed{\frac{1}{2}}",
                           r"\frac{1}{2}").result() == 1.0
        assert pool.submit(math_verify_score, "math", r"\boxed{0.5}",
                           r"\frac{1}{2}").result() == 1.0


@pytest.fixture(scope="module")
def verl_manager(tokenizer, tmp_path_factory):
    """verl's reward manager for a reward group, built by verl from our overrides."""
    from verl.trainer.ppo.reward import load_reward_manager

    def build(reward: RewardParams, path: str | None = None):
        config = compose_verl_config(["data.max_response_length=64",
                                      *reward_overrides(reward, path)])
        return load_reward_manager(config, tokenizer)

    return build


def _run_single(manager, tokenizer, source: str, response: str, truth: str) -> dict:
    row = {"data_source": source, "reward_model": {"ground_truth": truth},
           "prompt": [{"role": "user", "content": "What is it?"}], "extra_info": {}}
    return manager.loop.run_until_complete(
        manager.run_single(reward_sample(tokenizer, row, response)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_builtin_reward_scores_through_verls_reward_manager(name, verl_manager,
                                                                 tokenizer) -> None:
    if name == "code_tests" and (why := sandbox_problem()):
        pytest.skip(why)
    source, right, wrong, truth = CASES[name]
    manager = verl_manager(RewardParams.model_validate(
        {"custom_reward_function": {"name": name}, **SETTINGS.get(name, {})}))
    scored = _run_single(manager, tokenizer, source, right, truth)
    assert scored["reward_score"] == 1.0, scored
    assert scored["reward_extra_info"]["reward_error"] == 0.0
    assert _run_single(manager, tokenizer, source, wrong, truth)["reward_score"] < 1.0


@pytest.mark.slow
def test_a_hung_sample_scores_zero_and_the_next_one_is_scored(verl_manager, tokenizer,
                                                              tmp_path: Path) -> None:
    """In verl's reward manager, on its executor thread: the hung sample's worker is killed
    at the limit, the sample scores 0 counted as a timeout, and scoring goes on."""
    (tmp_path / "hang.py").write_text(HANG)
    path = str(tmp_path / "hang.py")
    manager = verl_manager(RewardParams(timeout_s=1.0, custom_reward_function={
        "path": path, "name": "score"}), path)
    started = time.perf_counter()
    hung = _run_single(manager, tokenizer, "mine", "hang", "1")
    assert time.perf_counter() - started < 30
    assert hung["reward_score"] == 0.0
    assert hung["reward_extra_info"]["reward_timeout"] == 1.0
    assert hung["reward_extra_info"]["reward_error"] == 0.0
    fine = _run_single(manager, tokenizer, "mine", "fine", "1")
    assert fine["reward_score"] == 1.0 and fine["reward_extra_info"]["reward_timeout"] == 0.0


def test_trls_reward_function_reports_timeouts_and_degeneration(tmp_path: Path) -> None:
    """TRL's call: one batch per step, with its log_metric; a hung completion scores 0 and
    is counted, a repetitive one counted as such."""
    from rl_pipeline.engines.trl.inputs import TrlReward

    (tmp_path / "hang.py").write_text(HANG)
    reward = TrlReward(RewardParams(timeout_s=1.0, custom_reward_function={
        "path": str(tmp_path / "hang.py"), "name": "score"}), stop_ids=[0],
        max_completion_length=8)
    logged: dict[str, float] = {}
    prompts = [[{"role": "user", "content": "What is 1 + 1?"}]] * 3
    scores = reward(prompts, ["2", "hang", "#### 2\n#### 2\n#### 2\n#### 2"],
                    ["s"] * 3, ["2"] * 3, ["{}"] * 3,
                    completion_ids=[[5, 0], [5, 6, 7, 8, 9, 10, 11, 12], [5, 0]],
                    log_metric=lambda name, value: logged.__setitem__(name, value))
    assert scores == [1.0, 0.0, 1.0]
    assert logged[PREFIX + "reward_timeout/mean"] == pytest.approx(1 / 3)
    assert logged[PREFIX + "truncation_rate"] == pytest.approx(1 / 3)  # the 8-token one
    assert logged[PREFIX + "repetition_rate"] == pytest.approx(1 / 3)
    # The reward curve's band: the spread of the step's rewards and the values they reached.
    assert logged[PREFIX + "reward/mean"] == pytest.approx(statistics.fmean(scores))
    assert logged[PREFIX + "reward/std"] == pytest.approx(statistics.pstdev(scores))
    assert (logged[PREFIX + "reward/min"], logged[PREFIX + "reward/max"]) == (0.0, 1.0)
    assert reward.safe.timeouts == 1


def test_eval_counts_timeouts_apart_from_errors(tmp_path: Path) -> None:
    boom_source = "\ndef boom(*args, **kwargs):\n    raise KeyError(1)\n"
    (tmp_path / "hang.py").write_text(HANG + boom_source)
    hang = build_reward(RewardParams(timeout_s=1.0, custom_reward_function={
        "path": str(tmp_path / "hang.py"), "name": "score"}))
    scored = hang.score("s", "hang", "1")
    assert (scored.reward, scored.timed_out, scored.parts()["reward_timeout"]) == (0.0, True, 1.0)
    boom = build_reward(RewardParams(custom_reward_function={
        "path": str(tmp_path / "hang.py"), "name": "boom"}))
    failed = boom.score("s", "x", "1")
    assert failed.parts()["reward_error"] == 1.0 and not failed.timed_out
    assert failed.error == f"KeyError: 1 ({tmp_path / 'hang.py'}:8 in boom)"  # and where
    # strict: the run ends with it (as RewardRaised: a worker's exception need not unpickle)
    with pytest.raises(RewardRaised, match="KeyError: 1"):
        build_reward(RewardParams(strict=True, custom_reward_function={
            "path": str(tmp_path / "hang.py"), "name": "boom"}))("s", "x", "1")


def test_the_reward_loop_pattern_runs_many_samples_at_once() -> None:
    """verl's reward loop scores a step's samples concurrently (run_in_executor): every one
    gets its own answer back."""
    reward = build_reward(RewardParams())

    async def all_of_them():
        loop = asyncio.get_running_loop()
        return await asyncio.gather(*[
            loop.run_in_executor(None, reward, "math", rf"\boxed{{{i}}}", str(i % 3))
            for i in range(12)])

    assert asyncio.run(all_of_them()) == [1.0 if i == i % 3 else 0.0 for i in range(12)]


CODE_ROWS = [{"data_source": "apps", "reward_model": {"ground_truth": '{"inputs": ["1"]}'},
              "prompt": [{"role": "user", "content": "Write code."}], "extra_info": {}}] * 3


@pytest.mark.parametrize("self_test", ["error", "off"])
def test_code_that_verl_would_run_on_this_host_is_refused_before_any_scoring(
        self_test: str) -> None:
    """verl's default_compute_score runs 'apps' answers with prime_code on the host: the
    self-test itself would run them, so the refusal comes first, whatever self_test says."""
    from rl_pipeline.rewards.self_test import ModelCodeOnHostError, run_self_test

    def must_not_score(*_):
        raise AssertionError("scored a code row")

    with pytest.raises(ModelCodeOnHostError) as caught:
        run_self_test(must_not_score, CODE_ROWS, RewardParams(self_test=self_test))
    message = str(caught.value)
    assert message.startswith("reward.custom_reward_function.name=compute_score hands "
                              "data_source 'apps' to verl's default_compute_score")
    assert message.endswith("a Sandbox Fusion URL) (3 rows)")
    assert "data_prep.data_source=code_tests" in message
    assert "(prime_code) runs the model's generated code on this machine" in message
    assert "reward.custom_reward_function" in message.split("Refused.")[1]


def test_a_reward_of_your_own_may_score_code_rows(tmp_path: Path) -> None:
    from rl_pipeline.rewards.self_test import run_self_test

    report, _ = run_self_test(lambda *_: 1.0, CODE_ROWS, RewardParams(
        self_test="warn", custom_reward_function={"path": str(tmp_path / "sandboxed.py")}))
    assert set(report) == {"apps"}


@pytest.mark.slow
def test_verls_preflight_names_the_code_refusal_on_the_rewards_name(tokenizer) -> None:
    from rl_pipeline.engines.verl.checks import check_reward

    reward = RewardParams()
    config = compose_verl_config(["data.max_response_length=64",
                                  *reward_overrides(reward, None)])
    problems, report = check_reward(config, tokenizer, CODE_ROWS, reward)
    assert report == {} and len(problems) == 1
    assert str(problems[0]).startswith("reward.custom_reward_function.name='compute_score': "
                                       "reward.custom_reward_function.name=compute_score "
                                       "hands data_source 'apps'")


@pytest.mark.slow
def test_weighted_terms_score_and_report_each_term_through_verls_reward_manager(
        verl_manager, tokenizer) -> None:
    manager = verl_manager(RewardParams.model_validate(TERMS))
    right = _run_single(manager, tokenizer, "openai/gsm8k", "24 + 48 = 72\n#### 72", "72")
    wrong = _run_single(manager, tokenizer, "openai/gsm8k", "24 + 48 = 70\n#### 70", "72")
    assert right["reward_score"] == pytest.approx(1.1)
    assert wrong["reward_score"] == pytest.approx(0.1)
    assert {k: wrong["reward_extra_info"][k] for k in ("term_correct", "term_format")} == {
        "term_correct": 0.0, "term_format": 1.0}


def test_trl_logs_each_weighted_term_per_step() -> None:
    from rl_pipeline.engines.trl.inputs import TrlReward

    logged: dict[str, float] = {}
    reward = TrlReward(RewardParams.model_validate(TERMS), stop_ids=[0],
                       max_completion_length=16)
    scores = reward([[{"role": "user", "content": "24 + 48?"}]] * 2,
                    ["24 + 48 = 72\n#### 72", "24 + 48 = 70\n#### 70"], ["openai/gsm8k"] * 2,
                    ["72"] * 2, ["{}"] * 2, completion_ids=[[5, 0], [5, 0]],
                    log_metric=lambda name, value: logged.__setitem__(name, value))
    assert scores == pytest.approx([1.1, 0.1])
    assert logged[PREFIX + "term_correct/mean"] == 0.5
    assert logged[PREFIX + "term_format/mean"] == 1.0


def test_a_term_that_raises_scores_zero_alone_and_is_counted(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text("def boom(*args, **kwargs):\n    raise KeyError(1)\n")
    reward = build_reward(RewardParams.model_validate({"terms": [
        {"name": "compute_score", "label": "correct"},
        {"name": "boom", "path": str(tmp_path / "boom.py"), "weight": 0.5}]}))
    scored = reward.score("openai/gsm8k", "#### 72", "72")
    assert (scored.reward, scored.extra) == (1.0, {"term_correct": 1.0, "term_boom": 0.0})
    assert scored.parts()["reward_error"] == 1.0 and "boom: KeyError" in scored.error
    assert reward.errors == 1


# A reward of the user's own that fails the way user code fails, each on its word.
FAILS = """
import sys


class NoAnswerLine(Exception):  # a class of this file: it must not break the way back
    pass


def score(data_source, solution_str, ground_truth, extra_info=None):
    if "exit" in solution_str:
        sys.exit(3)
    if "mine" in solution_str:
        raise NoAnswerLine("no answer line")
    if "text" in solution_str:
        return {"score": "1.0", "acc": 1.0}
    return {"score": 1.0, "acc": 1.0, "reward_error": 5.0}
"""


def verls_table(infos: list[dict]) -> dict:
    """verl's per-sample reward table, as its agent loop builds it (agent_loop.py
    ``_postprocess`` and reward_loop.py ``compute_rm_score``, verl 0.9.1): the first sample's
    keys, looked up in every sample."""
    import numpy as np

    return {key: np.array([info[key] for info in infos]) for key in infos[0]}


@pytest.mark.slow
@pytest.mark.parametrize("timeout_s", [10.0, None], ids=["worker", "thread"])
def test_a_failed_sample_scores_zero_in_verls_reward_manager_and_keeps_its_table_whole(
        verl_manager, tokenizer, tmp_path: Path, timeout_s) -> None:
    """A reward that raises (a class of its own file), calls sys.exit, or returns text: each
    sample scores 0 and is counted, where the run went on; every sample carries the same
    parts, failed or not, or verl's table raised KeyError and ended the step."""
    (tmp_path / "fails.py").write_text(FAILS)
    path = str(tmp_path / "fails.py")
    manager = verl_manager(RewardParams(timeout_s=timeout_s, custom_reward_function={
        "path": path, "name": "score"}), path)
    scored = [_run_single(manager, tokenizer, "mine", response, "1")
              for response in ("fine", "mine", "exit", "text")]
    assert [s["reward_score"] for s in scored] == [1.0, 0.0, 0.0, 0.0]
    infos = [s["reward_extra_info"] for s in scored]
    assert [i["reward_error"] for i in infos] == [0.0, 1.0, 1.0, 1.0]  # not the 5.0 it said
    assert {frozenset(i) for i in infos} == {frozenset(  # "acc" is not logged: docs/rewards.md
        ["score", "reward_function", "overlong_penalty", "reward_error", "reward_timeout"])}
    for order in (infos, infos[::-1]):
        assert len(verls_table(order)["reward_error"]) == 4


def test_what_a_reward_raised_names_its_type_message_and_line(tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text(FAILS)
    for timeout_s in (10.0, None):
        reward = build_reward(RewardParams(timeout_s=timeout_s, custom_reward_function={
            "path": str(tmp_path / "fails.py"), "name": "score"}))
        assert reward.score("s", "mine", "1").error == \
            f"NoAnswerLine: no answer line ({tmp_path / 'fails.py'}:13 in score)"
        assert reward.score("s", "exit", "1").error.startswith("SystemExit: 3 (")
        assert reward.score("s", "text", "1").error == \
            "NotAScore: returned str '1.0', not a number"
        assert reward.errors == 3


@pytest.mark.slow
def test_a_weighted_reward_with_a_failing_judge_term_keeps_verls_table_whole(
        verl_manager, tokenizer) -> None:
    """A judge term whose endpoint is not there: its sample scores the other term alone and
    still carries the judge's parts (as 0), as a sample the judge answered does."""
    manager = verl_manager(RewardParams.model_validate({"terms": [
        {"name": "compute_score", "label": "correct"},
        {"name": "judge", "weight": 0.5}],
        "judge": {"url": "http://127.0.0.1:9/v1", "served_model": "none", "retries": 0,
                  "request_timeout_s": 2}}))
    failed = _run_single(manager, tokenizer, "openai/gsm8k", "#### 72", "72")
    assert failed["reward_score"] == 1.0
    info = failed["reward_extra_info"]
    assert info["reward_error"] == 1.0 and info["term_judge"] == 0.0
    assert {k: info[k] for k in info if k.startswith("judge_")} == dict.fromkeys(
        ["judge_prompt_tokens", "judge_completion_tokens", "judge_unparsed", "judge_cached"],
        0.0)


def test_a_reward_file_that_imports_slowly_is_imported_before_the_first_sample(
        tmp_path: Path) -> None:
    """Its import (torch, a model) is not counted against a sample's limit: each worker
    imports it before it takes a sample."""
    (tmp_path / "slow.py").write_text(
        "import time\ntime.sleep(2)\n\ndef score(*args, **kwargs):\n    return 1.0\n")
    reward = build_reward(RewardParams(timeout_s=1.0, custom_reward_function={
        "path": str(tmp_path / "slow.py"), "name": "score"}))
    scored = [reward.score("s", "x", "1") for _ in range(3)]
    assert [s.reward for s in scored] == [1.0] * 3, [s.error for s in scored]
    assert reward.timeouts == 0


# Scores 1.0 only when another sample is being scored at the same time: each waits up to
# 20 s for the other's mark.
MEETS = """
import os, pathlib, time


def score(data_source, solution_str, ground_truth, extra_info=None):
    folder = pathlib.Path(ground_truth)
    (folder / solution_str).touch()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if len(list(folder.iterdir())) >= 2:
            return 1.0
        time.sleep(0.01)
    return 0.0
"""


# In a process of its own, on every core: the suite pins each of its workers to one.
BATCH = """
import os, sys
os.sched_setaffinity(0, range(os.cpu_count()))
from rl_pipeline.params import RewardParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.isolation import workers

folder = sys.argv[1]
reward = build_reward(RewardParams(custom_reward_function={
    "path": os.path.join(folder, "meets.py"), "name": "score"}))
samples = [("s", name, os.path.join(folder, "marks"), None) for name in ("a", "b")]
print("SCORES", workers(), [s.reward for s in reward.score_batch(samples)])
"""


@pytest.mark.slow
def test_a_batch_is_scored_by_as_many_worker_processes_as_the_pool_has(tmp_path: Path) -> None:
    """TRL's step and eval score a batch through score_batch: two samples in flight at once,
    where the pool has two workers (they were scored one after another)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the pool has one worker")
    (tmp_path / "meets.py").write_text(MEETS)
    (tmp_path / "marks").mkdir()
    done = subprocess.run([sys.executable, "-c", BATCH, str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("SCORES")), None)
    assert line is not None, done.stderr[-3000:]
    pool, scores = line.split(" ", 2)[1:]
    assert int(pool) >= 2 and scores == "[1.0, 1.0]", line


def test_a_pool_replaced_for_a_new_reward_file_stops(tmp_path: Path) -> None:
    """Each reward file new to a process replaces its scorer pool (the new workers import
    it before their first sample); the old pool's workers end with it, not at exit."""
    import psutil

    from rl_pipeline.rewards.isolation import workers

    def scored(i: int) -> float:
        (tmp_path / f"r{i}.py").write_text(SCORE_ONE)
        return build_reward(RewardParams(custom_reward_function={
            "path": str(tmp_path / f"r{i}.py"), "name": "score"})).score("s", "x", "1").reward

    def processes() -> int:
        return len(psutil.Process().children(recursive=True))

    before = processes()  # what earlier tests of this process left (a pool of theirs)
    assert [scored(i) for i in range(4)] == [1.0] * 4
    # At most one pool's workers more, and the forkserver and resource tracker behind them
    deadline = time.monotonic() + 30
    while processes() > before + workers() + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes() <= before + workers() + 2


def test_an_async_reward_is_awaited_and_a_generator_or_class_refused(tmp_path: Path) -> None:
    (tmp_path / "kinds.py").write_text(
        "import asyncio\n\n"
        "async def later(*args, **kwargs):\n    await asyncio.sleep(0)\n    return 1.0\n\n"
        "def yields(*args, **kwargs):\n    yield 1.0\n\n"
        "class Scorer:\n    def __init__(self, *args, **kwargs):\n        pass\n")
    path = str(tmp_path / "kinds.py")
    for timeout_s in (10.0, None):
        reward = build_reward(RewardParams(timeout_s=timeout_s, custom_reward_function={
            "path": path, "name": "later"}))
        assert reward.score("s", "x", "1").reward == 1.0
    for name, what in (("yields", "is a generator"), ("Scorer", "is a class")):
        with pytest.raises(ValueError, match=f"reward.custom_reward_function.name='{name}' "
                                             f"in {path} {what}"):
            build_reward(RewardParams(custom_reward_function={"path": path, "name": name}))


STARTS_AT_BUILD = """
import sys, time
import psutil
from verl.trainer.ppo.reward import load_reward_manager
from rl_pipeline.engines.verl.config import compose_verl_config, reward_overrides
from rl_pipeline.models.tokenizer import load_tokenizer
from rl_pipeline.params import RewardParams
from rl_pipeline.rewards.isolation import workers

overrides = reward_overrides(RewardParams(), None)
config = compose_verl_config(["data.max_response_length=64", *overrides])
load_reward_manager(config, load_tokenizer(sys.argv[1]))
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    processes = psutil.Process().children(recursive=True)
    if len(processes) > workers():  # the forkserver and its workers
        break
    time.sleep(0.2)
print(len(processes), workers(), config.reward.num_workers)
"""


@pytest.mark.slow
def test_verls_reward_manager_starts_its_scorer_processes_when_built(tokenizer_dir) -> None:
    """Before any sample: verl picks a reward worker at random per sample, so a pool started
    at a worker's first sample held up a later step's whole rollout (docs/gpu.md, the
    second lent H100 session). A fresh process, so no earlier test's pool is there."""
    result = subprocess.run([sys.executable, "-c", STARTS_AT_BUILD, str(tokenizer_dir)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    processes, workers, reward_workers = map(int, result.stdout.split()[-3:])
    assert processes > workers, result.stdout
    # Each of verl's reward workers (8) a share of the cores, not min(8, cores) each: on a
    # node of 16 cores 16 scorer processes in all, not 64 (on 2 cores, 1 each).
    assert reward_workers == 8
    cores = len(os.sched_getaffinity(0))
    assert workers * reward_workers <= max(cores, reward_workers), (workers, cores)
