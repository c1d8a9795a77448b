"""A judge endpoint whose "model" is a rule, for tests of the judge reward's client side.

It speaks the OpenAI chat-completions protocol on the loopback address (the only network a
test may use) and grades as a perfect judge would on GSM8K-style answers: ``SCORE: 1`` when
the response's last ``#### <n>`` equals the reference answer, else ``SCORE: 0``. Its
behaviour can be made hostile: garbled replies, failures before success (5xx, 429), slow
answers. The judge reward itself, the OpenAI client, the cache and the trainers' call paths
are the real ones; a real model behind a real server is tested in test_judge.py's slow test.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_REFERENCE = re.compile(r"Reference answer:\n(.*?)\n\nResponse:\n(.*?)\n\nRubric:", re.S)


@dataclass
class Behaviour:
    """What the endpoint does; tests change it while it runs."""

    reply: str | None = None  # a fixed reply instead of the rule's (e.g. garbled)
    fail_first: int = 0  # answer this many requests with ``fail_status`` first
    fail_status: int = 500
    delay_s: float = 0.0
    requests: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    bodies: list[dict] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)  # each request's Authorization
    lock: threading.Lock = field(default_factory=threading.Lock)


def rule_reply(content: str) -> str:
    match = _REFERENCE.search(content)
    if match is None:
        return "I cannot tell."
    truth, response = match.group(1).strip(), match.group(2)
    answers = re.findall(r"####\s*(-?[\d.,]+)", response)
    right = bool(answers) and answers[-1].replace(",", "") == truth.replace(",", "")
    return f"The final answer is {answers[-1] if answers else 'missing'}.\nSCORE: {int(right)}"


class RuleJudge:
    """The endpoint, served on a thread: ``url`` is its base URL (``.../v1``)."""

    def __init__(self) -> None:
        self.behaviour = Behaviour()
        behaviour = self.behaviour

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # the health check
                self._send(200, {"status": "ok"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with behaviour.lock:
                    behaviour.requests += 1
                    behaviour.bodies.append(body)
                    behaviour.keys.append(self.headers.get("Authorization"))
                    failing = behaviour.fail_first > 0
                    behaviour.fail_first -= failing
                    behaviour.in_flight += 1
                    behaviour.most_in_flight = max(behaviour.most_in_flight,
                                                   behaviour.in_flight)
                time.sleep(behaviour.delay_s)
                with behaviour.lock:  # done before answering: the client may ask again at once
                    behaviour.in_flight -= 1
                if failing:
                    self._send(behaviour.fail_status, {"error": {"message": "try again"}})
                    return
                content = body["messages"][-1]["content"]
                reply = behaviour.reply if behaviour.reply is not None else rule_reply(content)
                self._send(200, {
                    "id": "rule", "object": "chat.completion", "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply}}],
                    "usage": {"prompt_tokens": len(content.split()),
                              "completion_tokens": len(reply.split()),
                              "total_tokens": len(content.split()) + len(reply.split())}})

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> RuleJudge:
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.server.shutdown()
        self.server.server_close()
