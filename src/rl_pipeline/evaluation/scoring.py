"""Scoring generations: the configured reward (the headline), GSM8K's strict and flexible
scores where they apply, and the answer each response gives (for majority voting)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from rl_pipeline.evaluation.answers import extract_answer
from rl_pipeline.evaluation.generate import Generation
from rl_pipeline.evaluation.gsm8k import flexible_score, is_gsm8k_source, strict_match, strict_score
from rl_pipeline.params import RewardParams
from rl_pipeline.rewards import Reward, build_reward
from rl_pipeline.rewards.form import has_no_reasoning, is_repetitive, response_facts
from rl_pipeline.rewards.scoring import JUDGE_PART, TERM


def eval_reward(reward: RewardParams) -> Reward:
    """The ``reward`` group's function, as training uses it."""
    return build_reward(reward)


def score_generations(prompts: pd.DataFrame, generations: Sequence[Generation], label: str,
                      reward: Reward, max_new_tokens: int) -> pd.DataFrame:
    """One row per generation: the prompt, the response, its reward and correctness.

    Args:
        prompts: Prompts in verl's schema (``data_source``, ``prompt``, ``reward_model``, ...).
        generations: The responses, indexed by prompt position.
        label: The model label (``base``, ``trained``).
        reward: The configured reward function (:func:`eval_reward`).
        max_new_tokens: The generation cap, which the reward learns with each response's
            length and truncation in ``extra_info``, as in training.

    Returns:
        Columns ``model``, ``prompt_index``, ``sample_index``, ``data_source``, ``prompt``,
        ``ground_truth``, ``response``, ``response_tokens``, ``truncated``, ``reward`` (the
        headline), ``function_score`` (the reward function's own score, before the overlong
        penalty: correctness), ``reward_error`` (the reward function raised; scored 0),
        ``reward_timeout`` (it ran past ``reward.timeout_s``; scored 0), ``strict`` and
        ``flexible`` (lm-evaluation-harness's GSM8K scores, 1.0 or 0.0, on GSM8K sources
        only, else NaN: see :func:`~rl_pipeline.evaluation.gsm8k.is_gsm8k_source`),
        ``strict_format`` (1.0 when strict-match finds a ``#### <number>`` answer, right or
        wrong; GSM8K sources only, else NaN), ``answer`` (the extracted answer that
        majority voting counts; None: no answer), and the degeneration flags of
        :mod:`rl_pipeline.rewards.form`: ``repetitive`` and ``no_reasoning``; with
        ``reward.terms``, each term's score (``term_<label>``); with the judge reward, its
        tokens, unparsed and cached flags (``judge_*``: :data:`rl_pipeline.rewards.judge.
        PARTS`). Scored ``reward.score_batch`` at a time (a judge's requests overlap).
    """
    samples = []
    for g in generations:
        row = prompts.iloc[g.prompt_index]
        extra = row["extra_info"] if "extra_info" in prompts else None
        facts = response_facts(g.tokens, max_new_tokens, g.truncated)
        samples.append((str(row["data_source"]), g.text, str(row["reward_model"]["ground_truth"]),
                        {**(extra or {}), **facts}))
    rows = []
    for g, (source, _, truth, _), scored in zip(generations, samples,
                                                reward.score_batch(samples), strict=True):
        row = prompts.iloc[g.prompt_index]
        gsm8k = is_gsm8k_source(source)
        rows.append({
            "model": label, "prompt_index": g.prompt_index, "sample_index": g.sample_index,
            "data_source": source, "prompt": _last_user_message(row["prompt"]),
            "ground_truth": truth, "response": g.text, "response_tokens": g.tokens,
            "truncated": g.truncated,
            "reward": scored.reward,
            # Before the overlong penalty: what says whether the answer is right (pass@k).
            "function_score": scored.function_score,
            "reward_error": scored.error is not None and not scored.timed_out,
            "reward_timeout": scored.timed_out,
            "strict": strict_score(g.text, truth) if gsm8k else math.nan,
            "flexible": flexible_score(g.text, truth) if gsm8k else math.nan,
            "strict_format": float(strict_match(g.text) is not None) if gsm8k else math.nan,
            "answer": extract_answer(source, g.text, scored.pred),
            "repetitive": is_repetitive(g.text),
            "no_reasoning": has_no_reasoning(g.text),
            **{k: v for k, v in scored.extra.items() if k.startswith((TERM, JUDGE_PART))},
        })
    return pd.DataFrame(rows)


def _last_user_message(messages) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return users[-1] if users else ""
