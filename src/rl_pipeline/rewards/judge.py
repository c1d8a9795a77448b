"""The ``judge`` reward: a judge model grades each response through an OpenAI-compatible
chat endpoint (``reward.judge``; docs/rewards.md, "A judge model").

The judge is shown the question, the response, the reference answer and the rubric, and must
end its reply with one line ``SCORE: <n>``, n in 0..``max_score``; the reward is
n / ``max_score``. The parse is strict (:func:`parse_score`): a reply without that last line
scores 0 and is counted (``judge_unparsed``), never guessed from the text.

Requests go through the OpenAI client (its per-request timeout, and retries with exponential
backoff on connection errors, timeouts, 429 and 5xx), at most ``concurrency`` at once per
process; replies are kept in a SQLite cache keyed by judge model, template and request, so a
rerun does not ask twice. The tokens each request cost are parts of the reward
(``judge_prompt_tokens``, ``judge_completion_tokens``: 0 for a cached reply), which both
trainers log per step and eval per model.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_pipeline.errors import UserError

if TYPE_CHECKING:
    from rl_pipeline.params.reward import JudgeParams

# A judge the project serves itself (rl_pipeline.rewards.judge_server) is found through these,
# set by the stage that started it: its base URL and the model name it serves. verl's
# workers get them in Ray's runtime_env (rl_pipeline.engines.verl.engine).
URL_ENV = "RL_PIPELINE_JUDGE_URL"
MODEL_ENV = "RL_PIPELINE_JUDGE_MODEL"

TEMPLATE = """You grade a response to a question.

Question:
{question}

Reference answer:
{ground_truth}

Response:
{response}

Rubric: {rubric}

Grade the response by the rubric with a whole number from 0 to {max_score} ({max_score}: fully \
meets it, 0: does not). Reply with one line and nothing else:
SCORE: <number>"""

PARTS = ("judge_prompt_tokens", "judge_completion_tokens", "judge_unparsed", "judge_cached")
_SCORE_LINE = re.compile(r"SCORE:\s*(\d+)")
NOTE_LIMIT = 300  # characters of the judge's reply kept with a score (self-test examples)


class JudgeUnavailableError(UserError, RuntimeError):
    """The judge reward was called where no judge endpoint is known."""


def parse_score(reply: str, max_score: int) -> int | None:
    """The judge's score: the reply's last non-empty line must be exactly ``SCORE: <n>``
    with n in 0..``max_score``; None otherwise (the reward then scores 0, counted)."""
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    match = _SCORE_LINE.fullmatch(lines[-1]) if lines else None
    if match is None:
        return None
    score = int(match.group(1))
    return score if score <= max_score else None


def template_text(params: JudgeParams) -> str:
    """The judge's prompt template: ``reward.judge.template``'s file, or :data:`TEMPLATE`."""
    if params.template:
        return Path(params.template).read_text(encoding="utf-8")
    return TEMPLATE


class Judge:
    """The judge reward function, with verl's reward signature. Thread-safe: one instance
    serves a trainer's reward threads; ``concurrency`` bounds its requests in flight."""

    __name__ = "judge"

    def __init__(self, params: JudgeParams) -> None:
        self.params = params
        self.template = template_text(params)
        self.concurrency = params.concurrency
        self._slots = threading.BoundedSemaphore(params.concurrency)
        self._lock = threading.Lock()
        self._client: Any = None
        self._cache = ReplyCache(params.cache_path) if params.cache_path else None

    @property
    def url(self) -> str:
        url = self.params.url or os.environ.get(URL_ENV)
        if not url:
            raise JudgeUnavailableError(
                f"reward.judge.model={self.params.model!r}: no judge server runs for this "
                "process. The stages that score start it (rl_pipeline.rewards.judge_server."
                "judge_served); outside them, set reward.judge.url to an endpoint")
        return url

    @property
    def model(self) -> str:
        return self.params.served_model or os.environ.get(MODEL_ENV) or str(self.params.model)

    def messages(self, question: str, response: str, ground_truth: str) -> list[dict[str, str]]:
        """The chat request for one response."""
        content = self.template.format(
            question=question or "(not given)", response=response, ground_truth=ground_truth,
            rubric=self.params.rubric, max_score=self.params.max_score)
        return [{"role": "user", "content": content}]

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None) -> dict[str, Any]:
        question = str((extra_info or {}).get("question", ""))
        messages = self.messages(question, solution_str, str(ground_truth))
        key = self._key(messages)
        cached = self._cache.get(key) if self._cache else None
        tokens = (0, 0)
        if cached is None:
            reply, tokens = self._ask(messages)
            if self._cache:
                self._cache.put(key, reply)
        else:
            reply = cached
        score = parse_score(reply, self.params.max_score)
        return {"score": 0.0 if score is None else score / self.params.max_score,
                "judge_prompt_tokens": float(tokens[0]),
                "judge_completion_tokens": float(tokens[1]),
                "judge_unparsed": float(score is None), "judge_cached": float(cached is not None),
                "note": reply[:NOTE_LIMIT]}

    def _key(self, messages: list[dict[str, str]]) -> str:
        p = self.params
        text = json.dumps([self.model, self.template, messages, p.max_tokens, p.temperature],
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def _ask(self, messages: list[dict[str, str]]) -> tuple[str, tuple[int, int]]:
        with self._slots:
            completion = self._openai().chat.completions.create(
                model=self.model, messages=messages, max_tokens=self.params.max_tokens,
                temperature=self.params.temperature)
        reply = (completion.choices[0].message.content or "") if completion.choices else ""
        usage = completion.usage
        return reply, (int(getattr(usage, "prompt_tokens", 0) or 0),
                       int(getattr(usage, "completion_tokens", 0) or 0))

    def _openai(self) -> Any:
        with self._lock:
            if self._client is None:
                from openai import OpenAI

                env = self.params.api_key_env
                if env and not os.environ.get(env):
                    raise JudgeUnavailableError(
                        f"reward.judge.api_key_env={env!r}: that environment variable is not "
                        "set here (set it in the shell, or conf/local's credentials)")
                # The client retries with exponential backoff and jitter (0.5 s, doubling,
                # at most 8 s) on connection errors, timeouts, 408, 409, 429 and 5xx.
                self._client = OpenAI(base_url=self.url,
                                      api_key=os.environ[env] if env else "no-key",
                                      timeout=self.params.request_timeout_s,
                                      max_retries=self.params.retries)
            return self._client


class ReplyCache:
    """The judge's replies by request key, in SQLite: one file any process may share (a
    trainer's reward workers, a rerun); SQLite's own transactions keep it whole."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT)")
            self._db = db
        return self._db

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._conn().execute("SELECT reply FROM replies WHERE key = ?",
                                       (key,)).fetchone()
        return None if row is None else str(row[0])

    def put(self, key: str, reply: str) -> None:
        with self._lock, self._conn() as db:
            db.execute("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)",
                       (key, reply))
