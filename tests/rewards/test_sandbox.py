"""The sandbox for model-generated code (rl_pipeline.rewards.sandbox), against hostile
programs: each is contained, scores 0 through the code reward, and leaves the host as it was.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from pathlib import Path

import pytest

from rl_pipeline.params import RewardParams
from rl_pipeline.rewards import build_reward
from rl_pipeline.rewards.sandbox import (
    SandboxLimits,
    code_tests,
    program_from_response,
    run_python,
    sandbox_problem,
)
from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.skipif(bool(reason := sandbox_problem()), reason=f"{reason}")

SOLUTION = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0"


def test_a_right_program_passes_its_tests_and_a_wrong_one_does_not() -> None:
    assert code_tests("code_tests", "Sure:\n" + SOLUTION, TESTS) == 1.0
    assert code_tests("code_tests", SOLUTION.replace("a + b", "a - b"), TESTS) == 0.0
    assert build_reward(RewardParams())("code_tests", SOLUTION, TESTS) == 1.0  # by data_source


def test_the_program_is_the_last_fenced_block() -> None:
    assert program_from_response("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert program_from_response("x = 1") == "x = 1"


def test_it_runs_as_nobody_in_an_empty_root() -> None:
    result = run_python("import os\nprint(os.getuid(), sorted(os.listdir('/')), os.getcwd())")
    uid, *_ = result.stdout.split()
    assert result.passed and result.stdout.rstrip().endswith("/scratch")
    assert "work" not in result.stdout and "root" not in result.stdout.split("]")[0]
    assert uid in ("65534", "0")  # nobody; 0 where only a user namespace is possible


def _server() -> tuple[socket.socket, list]:
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list = []

    def accept() -> None:
        server.settimeout(5)
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    return server, accepted


def test_hostile_programs_are_contained_and_score_zero(tmp_path: Path) -> None:
    """The table in docs/rewards.md: each program, what it tried, what happened."""
    server, accepted = _server()
    port = server.getsockname()[1]
    target = tmp_path / "outside.txt"
    target.write_text("untouched")
    pyproject = PROJECT_ROOT / "pyproject.toml"
    hostile = {
        "socket": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)",
        "write_outside": f"open({str(target)!r}, 'w').write('owned')",
        "write_usr": "open('/usr/evil', 'w').write('x')",
        "read_project": f"print(open({str(pyproject)!r}).read())",
        "fork_bomb": "import os\nwhile True:\n    os.fork()",
        "infinite_loop": "while True:\n    pass",
        "huge_allocation": "x = bytearray(8 << 30)",
    }
    limits = SandboxLimits(timeout_s=3.0, cpu_s=3)
    results = {name: run_python(code + "\n" + TESTS, limits) for name, code in hostile.items()}
    for name, result in results.items():
        assert not result.passed, name
        assert code_tests("code_tests", f"```python\n{hostile[name]}\n```", TESTS) == 0.0, name
    assert "Network is unreachable" in results["socket"].stderr
    assert accepted == []  # nothing reached the host's server
    assert "Read-only file system" in results["write_usr"].stderr
    assert "No such file or directory" in results["write_outside"].stderr
    assert target.read_text() == "untouched" and not Path("/usr/evil").exists()
    assert "No such file or directory" in results["read_project"].stderr
    assert "[project]" not in results["read_project"].stdout
    assert "MemoryError" in results["huge_allocation"].stderr
    assert results["infinite_loop"].timed_out or results["infinite_loop"].returncode != 0
    assert results["infinite_loop"].seconds < 6
    assert results["fork_bomb"].seconds < 6
    # Nothing of theirs runs on: no process of nobody is left (not even a zombie).
    left = subprocess.run(["pgrep", "-u", "65534"], capture_output=True, text=True).stdout
    assert left.strip() == ""
    server.close()
