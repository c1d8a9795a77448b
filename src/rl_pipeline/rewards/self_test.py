"""The reward self-test: does the configured reward read this data's answers?

The reward is chosen by ``data_source`` (:func:`scorer_for`), and a wrong choice fails
silently: MATH answers (``\\frac{1}{2}``) under the default ``openai/gsm8k`` score 0 for
every response, so training has no signal and nothing says why. Before any training, each
data source's ground truths are written as an ideal response
(:func:`ideal_response`: the answer in both ``\\boxed{}`` and ``#### `` form, which every
built-in scorer reads) and as the same response with a wrong answer
(:func:`wrong_answer`). The reward passes when, on at least :data:`PASS_SHARE` of the rows,
the ideal response scores at least ``reward.correct_score`` and the wrong one scores less
than the ideal one.

data_prep runs it on the prompts it is about to publish, both trainers' preflights on the
training prompts (verl's through verl's own reward manager).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from rl_pipeline.errors import UserError
from rl_pipeline.params.reward import REGEX
from rl_pipeline.rewards.form import response_facts
from rl_pipeline.rewards.scoring import (
    BUILTIN,
    CHOICE_SOURCES,
    CODE_TESTS_SOURCES,
    EXACT_MATCH_SOURCES,
    GSM8K_SOURCES,
    MATH_SOURCES,
    TERM,
    failure,
    score_concurrently,
)

if TYPE_CHECKING:
    from rl_pipeline.params import RewardParams

logger = logging.getLogger(__name__)

PASS_SHARE = 0.9
ROWS_PER_SOURCE = 64  # rows scored per data source, spread evenly over the split
EXAMPLES = 3
_SCORERS = {
    "strict_gsm8k": "GSM8K strict: the number after the last '#### '",
    "flexible_gsm8k": "GSM8K flexible: the last number",
    "math_verify_score": "math-verify: the \\boxed{} answer, compared as mathematics",
    "exact_match": "exact match: the final answer equal to the ground truth after "
                   "normalisation",
    "choice": "choice: the option letter (or label) the final answer picks",
    "code_tests": "code tests: the response's program with the ground truth's tests, run in "
                  "the sandbox",
    "regex": "regex: the answer reward.regex.pattern reads, equal to the ground truth after "
             "normalisation",
    "judge": "judge: a judge model grades the response (reward.judge)",
}
_FIX = ("set data_prep.data_source to a value whose scorer reads these answers (table: "
        "docs/rewards.md), or reward.custom_reward_function to a reward for this data; "
        "reward.self_test=warn only warns")


UNCHECKED_CODE = ("not checked: the ground truths are tests, and no ideal program can be "
                  "written from them; the sandboxed scorer itself is tested with programs "
                  "that pass and fail them (docs/rewards.md)")


class ModelCodeOnHostError(UserError, ValueError):
    """The reward would run model-generated code on this machine, outside any sandbox."""


def refuse_model_code_on_host(rows: Sequence[dict[str, Any]], reward: RewardParams) -> None:
    """Raise :class:`ModelCodeOnHostError` when the reward would execute model output here:
    a data source that verl's ``default_compute_score`` scores by running the code
    (:func:`rl_pipeline.params.reward.model_code_refusal`), reached through a built-in
    reward. It holds whatever
    ``reward.self_test`` says: the self-test itself would run the code."""
    from rl_pipeline.params.reward import model_code_refusal

    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["data_source"])] = counts.get(str(row["data_source"]), 0) + 1
    refused = [f"{why} ({n} rows)" for source, n in sorted(counts.items())
               if (why := model_code_refusal(source, reward))]
    sandboxed = sorted(set(counts) & CODE_TESTS_SOURCES)
    if sandboxed and any(not path and name in BUILTIN for path, name in reward.functions()):
        from rl_pipeline.rewards.sandbox import sandbox_problem

        if problem := sandbox_problem():
            refused += [f"data_source {source!r} ({counts[source]} rows): its programs run in "
                        f"the project's sandbox, which does not work on this machine: "
                        f"{problem}" for source in sandboxed]
    if refused:
        raise ModelCodeOnHostError("\n".join(refused))


class RewardSelfTestError(UserError, ValueError):
    """The reward does not score this data's ground truths as correct (or wrong answers as
    wrong). The message names the data source, the scorer, example rows and what to change."""


def scorer_for(data_source: str, name: str, path: str | None = None) -> str:
    """Which scorer the ``reward`` group's function applies to ``data_source``, in words."""
    if path:
        return f"{name} from {path}"
    if name in _SCORERS:
        return f"{name} ({_SCORERS[name]})"
    if name not in BUILTIN:
        return name
    if data_source in GSM8K_SOURCES:
        picked = ("GSM8K '#### <number>', 1.0 correct, 0.1 a wrong well-formed answer"
                  if name == "gsm8k_format_credit" else _SCORERS["strict_gsm8k"])
    elif data_source in MATH_SOURCES:
        picked = _SCORERS["math_verify_score"]
    elif data_source in EXACT_MATCH_SOURCES:
        picked = _SCORERS["exact_match"]
    elif data_source in CHOICE_SOURCES:
        picked = _SCORERS["choice"]
    elif data_source in CODE_TESTS_SOURCES:
        picked = _SCORERS["code_tests"]
    else:
        picked = f"verl's default_compute_score for {data_source!r}"
    return f"{name} -> {picked}, chosen by data_source {data_source!r}"


def ideal_response(truth: str) -> str:
    """A short, complete response that gives ``truth`` as the answer in every built-in
    scorer's format."""
    return f"So the answer is \\boxed{{{truth}}}.\n#### {truth}"


def regex_ideal(example: str) -> Callable[[str], str]:
    """Ideal responses for the regex reward: :func:`ideal_response`, then the answer as
    ``reward.regex.example`` writes it (the pattern reads the last match)."""
    return lambda truth: f"{ideal_response(truth)}\n{example.replace('{answer}', truth)}"


def wrong_answer(truth: str) -> str:
    """An answer that is not ``truth``: a number plus one, an option letter the next one
    (``B`` -> ``C``, ``Z`` -> ``A``), words with an ``x`` added (``refund`` -> ``refundx``),
    else ``truth`` with ``+1``."""
    letter = truth.strip()
    if len(letter) == 1 and letter.isascii() and letter.isalpha():
        return chr((ord(letter.upper()) - ord("A") + 1) % 26 + ord("A"))
    if truth.strip() and all(c.isalpha() or c == " " for c in truth.strip()):
        return f"{truth.strip()}x"  # a word stays a word: a pattern for words reads it whole
    try:
        value = float(truth.replace(",", ""))
    except ValueError:
        return f"{truth}+1"
    wrong = value + 1
    return str(int(wrong)) if wrong.is_integer() else str(wrong)


def self_test(score: Callable[[dict[str, Any], str, dict[str, Any]], float],
              rows: Sequence[dict[str, Any]], correct_score: float, reward_name: str,
              reward_path: str | None = None, *, workers: int = 1,
              judge: str | None = None, min_agreement: float = 0.8,
              ideal: Callable[[str], str] | None = None,
              ) -> dict[str, dict[str, Any]]:
    """Score each data source's ground truths as ideal and as wrong responses.

    Args:
        score: Scores one row (verl's schema) against a response, given its ``extra_info``
            (a number, or a :class:`~rl_pipeline.rewards.Scored` with the terms' scores)
            (a complete, untruncated response's :func:`~rl_pipeline.rewards.form.
            response_facts`). A raise scores 0 and is reported with the row.
        rows: Prompt rows in verl's schema; up to :data:`ROWS_PER_SOURCE` per data source,
            evenly spread, are scored.
        correct_score: ``reward.correct_score``, the score of a correct answer.
        reward_name, reward_path: The reward, to name its scorer per source.
        workers: Responses scored at once (a judge's concurrency).
        ideal: Writes the ideal response for an answer (default :func:`ideal_response`;
            with the regex reward, :func:`regex_ideal` of its example).
        judge: The judge model, when the reward asks one: a data source then passes when
            the judge agrees with the known answers (ideal responses at ``correct_score``,
            wrong ones below it) on ``min_agreement`` of them, and the report has
            ``judge`` and ``agreement``.

    Returns:
        Per data source: ``scorer``, ``rows``, ``gold_correct`` (share of ideal responses at
        ``correct_score`` or more), ``wrong_below_gold`` (share of rows where the wrong answer
        scores less), ``errors`` (rows where the reward raised or timed out), ``passed``
        and ``examples`` (rows that failed, else the first ones;
        ``error`` holds what the reward raised, or returned instead of a finite number);
        with ``reward.terms`` (``score`` returning a :class:`~rl_pipeline.rewards.Scored`),
        ``terms``: each term's mean score on the ideal and on the wrong responses.
    """
    by_source: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_source.setdefault(str(row["data_source"]), []).append(row)
    out = {}
    for source, source_rows in sorted(by_source.items()):
        if source in CODE_TESTS_SOURCES and not reward_path and reward_name in BUILTIN:
            # Its ground truths are tests, from which no ideal program can be written.
            out[source] = {"scorer": scorer_for(source, reward_name, reward_path),
                           "rows": 0, "passed": True, "unchecked": UNCHECKED_CODE}
            continue
        step = max(1, len(source_rows) // ROWS_PER_SOURCE)
        chosen = source_rows[::step][:ROWS_PER_SOURCE]
        jobs = []
        for row in chosen:
            truth = str(row["reward_model"]["ground_truth"])
            write = ideal or ideal_response
            gold, wrong = write(truth), write(wrong_answer(truth))
            tokens = len(gold.split())
            facts = response_facts(tokens, max(tokens, 1) * 100, truncated=False)
            jobs += [(row, gold, facts), (row, wrong, facts)]
        scored = score_concurrently(partial(_scored, score), jobs, workers)
        results = []
        for i, row in enumerate(chosen):
            (gold_score, gold_error, gold_terms, gold_note), \
                (wrong_score, wrong_error, wrong_terms, wrong_note) = scored[2 * i:2 * i + 2]
            ok = gold_score >= correct_score and (wrong_score < correct_score if judge
                                                  else wrong_score < gold_score)
            results.append({"row": _row_id(row),
                            "ground_truth": str(row["reward_model"]["ground_truth"]),
                            "response": jobs[2 * i][1],
                            "score": gold_score, "wrong_response": jobs[2 * i + 1][1],
                            "wrong_score": wrong_score, "error": gold_error or wrong_error,
                            "ok": ok, "terms": (gold_terms, wrong_terms),
                            **({"judge_reply": gold_note, "judge_reply_wrong": wrong_note}
                               if judge else {})})
        gold_share = sum(r["score"] >= correct_score for r in results) / len(results)
        wrong_share = sum(r["wrong_score"] < r["score"] for r in results) / len(results)
        failed = [r for r in results if not r["ok"]]
        out[source] = {
            "scorer": scorer_for(source, reward_name, reward_path), "rows": len(results),
            "gold_correct": gold_share, "wrong_below_gold": wrong_share,
            "errors": sum(r["error"] is not None for r in results),
            # verl's default_compute_score (and ours after it) raise this for a data_source
            # they have no scorer for: then the data_source is what to change.
            "no_scorer": sum((r["error"] or "").startswith("NotImplementedError")
                             for r in results),
            "passed": gold_share >= PASS_SHARE and wrong_share >= PASS_SHARE,
            "examples": [{k: v for k, v in r.items() if k not in ("ok", "terms")}
                         for r in (failed or results)[:EXAMPLES]]}
        if judge:  # the share of the 2n responses the judge places on the right side
            agreement = (sum(r["score"] >= correct_score for r in results)
                         + sum(r["wrong_score"] < correct_score for r in results)) \
                / (2 * len(results))
            out[source].update({"judge": judge, "agreement": agreement,
                                "min_agreement": min_agreement,
                                "passed": agreement >= min_agreement})
        terms = sorted({t for r in results for t in r["terms"][0]})
        if terms:  # reward.terms: each term's mean on the ideal and on the wrong responses
            out[source]["terms"] = {t: {
                "gold": sum(r["terms"][0].get(t, 0.0) for r in results) / len(results),
                "wrong": sum(r["terms"][1].get(t, 0.0) for r in results) / len(results)}
                for t in terms}
    return out


def run_self_test(score: Callable[[dict[str, Any], str, dict[str, Any]], float],
                  rows: Sequence[dict[str, Any]], reward: RewardParams,
                  workers: int | None = None,
                  ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """:func:`self_test` as ``reward.self_test`` asks: skipped ('off'), logged ('warn') or
    returned as failures that must stop the run ('error').

    First, whatever ``reward.self_test`` says, data the reward would score by running the
    model's code on this machine is refused (:func:`refuse_model_code_on_host`).

    ``workers``: responses scored at once; default: the judge's ``concurrency`` for a judge,
    else 1 (1 where ``score`` is not thread-safe).

    Returns:
        The report per data source, and ``(data_source, message)`` per failure to stop on.
    """
    refuse_model_code_on_host(rows, reward)
    if reward.self_test == "off":
        return {"skipped": "reward.self_test=off"}, []
    fn = reward.custom_reward_function
    judge = (reward.judge.served_model or reward.judge.model) if reward.uses_judge else None
    uses_regex = any(name == REGEX and not path for path, name in reward.functions())
    report = self_test(score, rows, reward.correct_score, fn.name, fn.path,
                       workers=workers or (reward.judge.concurrency if judge else 1),
                       judge=judge, min_agreement=reward.judge.min_agreement,
                       ideal=regex_ideal(reward.regex.example) if uses_regex else None)
    failed = failures(report, reward.correct_score)
    if reward.self_test == "warn":
        for _, message in failed:
            logger.warning("%s", message)
        return report, []
    return report, failed


def failures(report: dict[str, dict[str, Any]],
             correct_score: float) -> list[tuple[str, str]]:
    """``(data_source, message)`` per data source that failed; the message names the scorer,
    3 rows and the parameter to change."""
    messages = []
    for source, result in report.items():
        if result["passed"]:
            continue
        rows = "; ".join(
            f"{e['row']}: ground truth {e['ground_truth']!r}, response {e['response']!r} "
            f"scored {e['score']:g}, wrong answer scored {e['wrong_score']:g}"
            + (f" (the judge replied {e['judge_reply']!r} and {e['judge_reply_wrong']!r})"
               if "judge_reply" in e else "")
            + (f" (the reward raised {e['error']})" if e["error"] else "")
            for e in result["examples"])
        if "agreement" in result:
            messages.append((source, _judge_failure(source, result, correct_score, rows)))
            continue
        errors = result.get("errors", 0)
        # A scorer that raised says nothing about whether it reads these answers.
        fix = (f"the reward function raised on {errors} of {result['rows']} rows, so "
               "changing data_prep.data_source cannot help: fix the reward function (or "
               "what it needs where it runs), then rerun" if errors else _FIX)
        if errors and result.get("no_scorer") == errors:
            fix = (f"the reward has no scorer for data_source {source!r} (NotImplementedError "
                   f"on every row): {_FIX}")
        messages.append((source,
            f"reward self-test failed for data_source {source!r} (scorer: {result['scorer']}): "
            f"ideal answers scored at least reward.correct_score={correct_score:g} on "
            f"{result['gold_correct']:.0%} of {result['rows']} rows and wrong answers scored "
            f"less on {result['wrong_below_gold']:.0%} (each needs {PASS_SHARE:.0%}). "
            f"Examples: {rows}. To fix: {fix}."))
    return messages


def _judge_failure(source: str, result: dict[str, Any], correct_score: float,
                   rows: str) -> str:
    return (f"reward self-test failed for data_source {source!r}: the judge "
            f"{result['judge']!r} agreed with the known answers on {result['agreement']:.0%} "
            f"of {2 * result['rows']} responses (ideal ones scored at least "
            f"reward.correct_score={correct_score:g} on {result['gold_correct']:.0%}, wrong "
            f"ones scored lower on {result['wrong_below_gold']:.0%}); "
            f"reward.judge.min_agreement={result['min_agreement']:g}. Examples: {rows}. To "
            "fix: a stronger judge (reward.judge.model or url), a clearer reward.judge.rubric "
            "or template; reward.self_test=warn trains with this judge anyway.")


def _scored(score: Callable[[dict[str, Any], str, dict[str, Any]], Any],
            row: dict[str, Any], response: str, facts: dict[str, Any]
            ) -> tuple[float, str | None, dict[str, float], str | None]:
    """The score, what went wrong (a raise or a value that is not a finite number), the
    weighted terms' scores and the scorer's note (a judge's reply) when ``score`` returns a
    :class:`~rl_pipeline.rewards.Scored`."""
    try:
        result = score(row, response, facts)
        value = float(result.reward if hasattr(result, "reward") else result)
    # user code on arbitrary text: report it with the row (a sys.exit() in it too)
    except (Exception, SystemExit) as exc:
        return 0.0, failure(exc)[:300], {}, None
    terms = {k[len(TERM):]: v for k, v in getattr(result, "extra", {}).items()
             if k.startswith(TERM)}
    note = getattr(result, "note", None)
    if not math.isfinite(value):
        return 0.0, f"a score of {value}", terms, note
    return value, None, terms, note


def _row_id(row: dict[str, Any]) -> str:
    info = row.get("extra_info") or {}
    if isinstance(info, dict) and "index" in info:
        return f"{info.get('split', 'row')} row {info['index']}"
    return "row"
