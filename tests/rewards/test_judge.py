"""The judge reward: a judge model grades responses through an OpenAI-compatible endpoint.

The client side (strict parse, cache, retries, timeouts, concurrency, the key from the
environment, the self-test's agreement) is tested against a rule-following endpoint on the
loopback address (tests/rewards/rule_judge.py); the trainers' call paths with it (verl's
async reward loop, TRL's batch, eval); and a real model behind the server the project starts
(`transformers serve`), in the slow test at the end.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pandas as pd
import pytest

from rl_pipeline.params import ConfigError, RewardParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.judge import MODEL_ENV, URL_ENV, JudgeUnavailableError, parse_score
from rl_pipeline.rewards.self_test import run_self_test
from rl_pipeline.training_rollouts import PREFIX
from tests.rewards.rule_judge import RuleJudge

QUESTION = {"question": "Natalia sold 48 clips in April and half as many in May. How many?"}
RIGHT = "48 / 2 = 24 in May, 48 + 24 = 72.\n#### 72"
WRONG = "48 + 48 = 96.\n#### 96"


@pytest.fixture
def judge():
    with RuleJudge() as server:
        yield server


def judged(judge: RuleJudge, tmp_path: Path, **settings) -> RewardParams:
    return RewardParams(custom_reward_function={"name": "judge"}, judge={
        "url": judge.url, "served_model": "rule", "cache_path": str(tmp_path / "cache.db"),
        **settings})


@pytest.mark.parametrize(("reply", "max_score", "expected"), [
    ("SCORE: 1", 1, 1),
    ("The answer matches.\nSCORE: 0", 1, 0),
    ("  SCORE:7  \n\n", 10, 7),
    ("SCORE: 2", 1, None),  # above max_score
    ("score: 1", 1, None),  # the format is exact
    ("SCORE: 1 because it matches", 1, None),
    ("SCORE: 1\nThank you!", 1, None),  # the score line must be the last
    ("72. Answer: 1", 1, None),  # what SmolLM2 replied: not guessed
    ("", 1, None),
])
def test_the_judges_answer_is_read_strictly(reply: str, max_score: int,
                                            expected: int | None) -> None:
    assert parse_score(reply, max_score) == expected


def test_it_scores_right_and_wrong_and_counts_the_judges_tokens(judge, tmp_path) -> None:
    reward = build_reward(judged(judge, tmp_path))
    right, wrong = reward.score_batch([("mine", RIGHT, "72", QUESTION),
                                       ("mine", WRONG, "72", QUESTION)])
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.parts()["judge_prompt_tokens"] > 50  # the question, response and rubric
    assert right.parts()["judge_completion_tokens"] > 0
    assert right.parts()["judge_unparsed"] == 0.0 and right.note.endswith("SCORE: 1")
    sent = judge.behaviour.bodies[0]
    assert sent["model"] == "rule" and sent["max_tokens"] == 64 and sent["temperature"] == 0
    assert QUESTION["question"] in sent["messages"][0]["content"]


def test_a_rerun_is_answered_from_the_cache_and_pays_nothing(judge, tmp_path) -> None:
    build_reward(judged(judge, tmp_path)).score("mine", RIGHT, "72", QUESTION)
    again = build_reward(judged(judge, tmp_path)).score("mine", RIGHT, "72", QUESTION)
    assert judge.behaviour.requests == 1
    assert again.reward == 1.0
    assert (again.parts()["judge_cached"], again.parts()["judge_prompt_tokens"]) == (1.0, 0.0)
    # Keyed by the judge model and the template too: another judge is asked afresh.
    build_reward(judged(judge, tmp_path, served_model="other")).score("m", RIGHT, "72",
                                                                      QUESTION)
    rubric = judged(judge, tmp_path, rubric="Only the number counts.")
    build_reward(rubric).score("m", RIGHT, "72", QUESTION)
    assert judge.behaviour.requests == 3


def test_an_unreadable_verdict_scores_zero_and_is_counted_not_guessed(judge, tmp_path) -> None:
    judge.behaviour.reply = "Yes, this is correct, score 1."
    scored = build_reward(judged(judge, tmp_path)).score("mine", RIGHT, "72", QUESTION)
    assert scored.reward == 0.0
    assert scored.parts()["judge_unparsed"] == 1.0
    assert scored.error is None  # the judge answered: not a failure of the reward


def test_failed_requests_are_retried_then_scored_zero_and_counted(judge, tmp_path) -> None:
    judge.behaviour.fail_first, judge.behaviour.fail_status = 2, 429
    scored = build_reward(judged(judge, tmp_path)).score("mine", RIGHT, "72", QUESTION)
    assert (scored.reward, judge.behaviour.requests) == (1.0, 3)  # two retries, then right
    judge.behaviour.fail_first, judge.behaviour.fail_status = 10, 500
    reward = build_reward(judged(judge, tmp_path, retries=1, cache_path=None))
    failed = reward.score("mine", RIGHT, "72", QUESTION)
    assert failed.reward == 0.0 and failed.parts()["reward_error"] == 1.0
    assert "InternalServerError" in failed.error
    assert judge.behaviour.requests == 5 and reward.errors == 1
    with pytest.raises(Exception, match="try again"):  # reward.strict: fatal, as asked
        build_reward(judged(judge, tmp_path, retries=0, cache_path=None), strict=True)(
            "mine", RIGHT, "72", QUESTION)


def test_a_slow_judge_runs_into_the_request_timeout(judge, tmp_path) -> None:
    judge.behaviour.delay_s = 3.0
    scored = build_reward(judged(judge, tmp_path, request_timeout_s=0.5, retries=0)).score(
        "mine", RIGHT, "72", QUESTION)
    assert scored.reward == 0.0 and "Timeout" in scored.error


def test_requests_overlap_up_to_the_concurrency_bound(judge, tmp_path) -> None:
    judge.behaviour.delay_s = 0.3
    reward = build_reward(judged(judge, tmp_path, concurrency=3, cache_path=None))
    scored = reward.score_batch([("mine", f"#### {i}", "72", QUESTION) for i in range(9)])
    assert len(scored) == 9 and judge.behaviour.requests == 9
    assert judge.behaviour.most_in_flight == 3


def test_the_key_comes_from_the_environment_variable_named(judge, tmp_path,
                                                           monkeypatch) -> None:
    params = judged(judge, tmp_path, api_key_env="JUDGE_TEST_KEY", cache_path=None)
    monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    failed = build_reward(params).score("mine", RIGHT, "72", QUESTION)
    assert "reward.judge.api_key_env='JUDGE_TEST_KEY'" in failed.error
    monkeypatch.setenv("JUDGE_TEST_KEY", "secret-123")
    assert build_reward(params).score("mine", RIGHT, "72", QUESTION).reward == 1.0
    assert judge.behaviour.keys[-1] == "Bearer secret-123"
    assert "secret-123" not in params.model_dump_json()  # the parameters hold the name only
    with pytest.raises(ConfigError, match="not a key"):
        RewardParams.model_validate({"custom_reward_function": {"name": "judge"}, "judge": {
            "url": judge.url, "served_model": "m", "api_key_env": "sk-12 34"}})


def test_the_judge_needs_an_endpoint(tmp_path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="neither model .* nor url"):
        RewardParams.model_validate({"custom_reward_function": {"name": "judge"}})
    with pytest.raises(ConfigError, match="served_model"):
        RewardParams.model_validate({"terms": [{"name": "judge"}],
                                     "judge": {"url": "http://127.0.0.1:1/v1"}})
    (tmp_path / "judge.txt").write_text("Grade {answer}: SCORE: <n>")
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['answer'\]"):
        RewardParams.model_validate({"custom_reward_function": {"name": "judge"}, "judge": {
            "model": "m", "template": str(tmp_path / "judge.txt")}})
    monkeypatch.delenv(URL_ENV, raising=False)
    served = build_reward(RewardParams(custom_reward_function={"name": "judge"},
                                       judge={"model": "m", "cache_path": None}), strict=True)
    with pytest.raises(JudgeUnavailableError, match="no judge server runs"):
        served("mine", RIGHT, "72", QUESTION)


ROWS = [{"data_source": "support", "reward_model": {"ground_truth": str(n)},
         "prompt": [{"role": "user", "content": f"What is {n}?"}],
         "extra_info": {"split": "train", "index": n, "question": f"What is {n}?"}}
        for n in range(20)]


def _score(reward):
    return lambda row, response, facts: reward.score(
        row["data_source"], response, row["reward_model"]["ground_truth"],
        {**row["extra_info"], **facts})


def test_the_self_test_reports_the_judges_agreement(judge, tmp_path) -> None:
    params = judged(judge, tmp_path)
    report, failed = run_self_test(_score(build_reward(params, strict=True)), ROWS, params)
    assert failed == []
    assert report["support"]["agreement"] == 1.0 and report["support"]["judge"] == "rule"


def test_a_poor_judge_stops_the_run_naming_it_its_agreement_and_examples(judge,
                                                                         tmp_path) -> None:
    judge.behaviour.reply = "SCORE: 1"  # says yes to everything
    params = judged(judge, tmp_path, min_agreement=0.8)
    report, failed = run_self_test(_score(build_reward(params, strict=True)), ROWS, params)
    assert report["support"]["agreement"] == 0.5
    ((source, message),) = failed
    assert source == "support"
    assert "the judge 'rule' agreed with the known answers on 50% of 40 responses" in message
    assert "reward.judge.min_agreement=0.8" in message
    assert message.count("the judge replied 'SCORE: 1'") == 3  # 3 examples


def test_judge_scores_through_verls_async_reward_loop(judge, tmp_path, tokenizer) -> None:
    """verl awaits our coroutine for a batch's samples at once (its reward manager,
    built by verl from our overrides); the judge's parts come back per sample."""
    from verl.trainer.ppo.reward import load_reward_manager

    from rl_pipeline.engines.verl.checks import reward_sample
    from rl_pipeline.engines.verl.config import compose_verl_config, reward_overrides

    judge.behaviour.delay_s = 0.2
    params = judged(judge, tmp_path, concurrency=4, cache_path=None)
    manager = load_reward_manager(compose_verl_config(
        ["data.max_response_length=64", *reward_overrides(params, None)]), tokenizer)
    assert manager.is_async_reward_score
    rows = [{**ROWS[0], "reward_model": {"ground_truth": "72"}, "extra_info": QUESTION}] * 8

    async def all_of_them():
        return await asyncio.gather(*[
            manager.run_single(reward_sample(tokenizer, row, RIGHT if i % 2 else WRONG))
            for i, row in enumerate(rows)])

    scored = manager.loop.run_until_complete(all_of_them())
    assert [s["reward_score"] for s in scored] == [0.0, 1.0] * 4
    assert all(s["reward_extra_info"]["judge_prompt_tokens"] > 0 for s in scored)
    assert judge.behaviour.most_in_flight > 1  # not one after the other


def test_trls_batch_logs_the_judges_tokens_per_step(judge, tmp_path) -> None:
    from rl_pipeline.engines.trl.inputs import TrlReward

    reward = TrlReward(judged(judge, tmp_path))
    logged: dict[str, float] = {}
    scores = reward([[{"role": "user", "content": "q"}]] * 2, [RIGHT, WRONG], ["s"] * 2,
                    ["72"] * 2, ['{"question": "q"}'] * 2,
                    log_metric=lambda name, value: logged.__setitem__(name, value))
    assert scores == [1.0, 0.0]
    total = logged[PREFIX + "judge_prompt_tokens/sum"]
    assert total == sum(len(b["messages"][0]["content"].split())
                        for b in judge.behaviour.bodies)
    assert logged[PREFIX + "judge_unparsed/sum"] == 0.0


def test_eval_reports_the_judges_totals_per_model(judge, tmp_path) -> None:
    from rl_pipeline.evaluation.generate import Generation
    from rl_pipeline.evaluation.metrics import model_metrics
    from rl_pipeline.evaluation.scoring import score_generations

    prompts = pd.DataFrame([{**ROWS[0], "reward_model": {"ground_truth": "72"},
                             "extra_info": QUESTION}])
    generations = [Generation(0, i, text, 12, False) for i, text in enumerate([RIGHT, WRONG])]
    frame = score_generations(prompts, generations, "trained",
                              build_reward(judged(judge, tmp_path)), 64)
    assert list(frame["reward"]) == [1.0, 0.0]
    metrics = model_metrics(frame, resamples=100)
    assert metrics["judge_prompt_tokens"] == int(frame["judge_prompt_tokens"].sum()) > 0
    assert metrics["judge_unparsed"] == 0


@pytest.mark.slow
def test_the_project_serves_a_real_judge_model_and_stops_it(tiny_model_dir, tmp_path,
                                                             monkeypatch) -> None:
    """`transformers serve` with a real (tiny, random) model: started on a free loopback
    port, answering the judge's request, known to the stage through the environment, and
    stopped after. A random model's reply is no verdict: scored 0, counted as unparsed."""
    from rl_pipeline.rewards.judge_server import JudgeServerError, judge_served

    monkeypatch.chdir(tmp_path)  # its resolved folder goes under data/
    monkeypatch.delenv(URL_ENV, raising=False)
    params = RewardParams(custom_reward_function={"name": "judge"},
                          judge={"model": str(tiny_model_dir), "max_tokens": 8,
                                 "server": "transformers"})
    with judge_served(params) as url:
        assert url.startswith("http://127.0.0.1:") and os.environ[URL_ENV] == url
        scored = build_reward(params, strict=True).score("s", RIGHT, "72", QUESTION)
        assert scored.parts()["judge_completion_tokens"] > 0
        assert scored.parts()["judge_unparsed"] == 1.0 and scored.reward == 0.0
        assert (tmp_path / "data/07_model_output/judge_cache.sqlite").is_file()
    assert URL_ENV not in os.environ and MODEL_ENV not in os.environ
    with pytest.raises(OSError):  # the server is gone
        import urllib.request
        urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2)
    broken = params.model_copy(update={"judge": params.judge.model_copy(
        update={"server_args": ["--no-such-flag"]})})
    with pytest.raises(JudgeServerError, match="exited with code"), judge_served(broken):
        pass


def test_data_preps_report_and_mlflow_numbers_carry_the_agreement(judge, tmp_path) -> None:
    from rl_pipeline.data.report import report_numbers
    from rl_pipeline.pipelines.data_prep.nodes import check_reward

    frame = pd.DataFrame(ROWS)
    _, _, report = check_reward(frame.head(12), frame.tail(8), judged(judge, tmp_path))
    assert report["support"]["agreement"] == 1.0
    numbers = report_numbers({"rows_in": 0, "rows_out": 0, "dropped": 0, "truncated": 0,
                              "train_val_overlap": 0, "prompt_tokens": 0,
                              "reward_self_test": report})
    assert numbers["reward_self_test"]["support"]["agreement"] == 1.0
