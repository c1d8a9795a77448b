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
    SANDBOX_UIDS,
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


@pytest.mark.parametrize("program", [
    "import sys\nsys.exit(0)", "raise SystemExit", "import os\nos._exit(0)",
    "import atexit, os\natexit.register(lambda: os._exit(0))",
    "class Any:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
    "def add(a, b):\n    return Any()",
    "class I(int):\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return I(0)",
], ids=["sys.exit", "SystemExit", "os._exit", "atexit", "equal to anything", "int subclass"])
def test_a_program_that_dodges_the_tests_scores_zero(program: str) -> None:
    """Each of these scored 1.0: it exited 0 before the tests ran, or returned a value that
    equals anything."""
    assert code_tests("code_tests", f"```python\n{program}\n```",
                      TESTS + "\nassert add(0, 0) != 1\nassert 3 in [add(1, 2)]") == 0.0


def test_a_program_that_prints_without_end_costs_the_host_no_memory() -> None:
    """Its output went through a pipe into this process, all of it, before 64 kB were
    kept: one response took gigabytes of the trainer's memory."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_python("import sys\nwhile True:\n    sys.stdout.buffer.write(b'x' * 2**20)",
                        SandboxLimits(timeout_s=10, file_mb=16))
    assert not result.passed and "File too large" in result.stderr  # the file-size limit
    assert len(result.stdout) == 65536
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB


def test_a_sandbox_whose_caller_was_killed_ends_at_its_limit(tmp_path: Path) -> None:
    """A reward worker killed past reward.timeout_s left its sandbox running, orphaned."""
    import os
    import signal
    import sys
    import time

    marker = f"SLEEPER={os.getpid()}"
    caller = subprocess.Popen([sys.executable, "-c", (
        "from rl_pipeline.rewards.sandbox import SandboxLimits, run_python\n"
        "run_python('import time\\ntime.sleep(600)', SandboxLimits(timeout_s=2), "
        f"env={{'SLEEPER': '{os.getpid()}'}})")])

    def sandboxes() -> list[str]:
        """This test's sandboxed processes (its variable in their environment)."""
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and \
                        marker.encode() in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(proc.name)
            except OSError:
                pass
        return found

    deadline = time.time() + 20
    while not sandboxes() and time.time() < deadline:
        time.sleep(0.05)
    assert sandboxes(), "the sandbox never started"
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    deadline = time.time() + 10
    while sandboxes() and time.time() < deadline:
        time.sleep(0.1)
    assert not sandboxes()


def test_the_program_is_the_last_fenced_block() -> None:
    assert program_from_response("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert program_from_response("x = 1") == "x = 1"


def _sandbox_user(uid: int) -> bool:
    first, size = SANDBOX_UIDS
    return first <= uid < first + size


def _sandbox_processes() -> list[str]:
    """Processes running as a sandbox's user, zombies included."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid = next(int(line.split()[1]) for line in status.read_text().splitlines()
                       if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if _sandbox_user(uid):
            found.append(status.parent.name)
    return found


def test_it_runs_as_a_user_of_its_own_in_an_empty_root() -> None:
    result = run_python("import os\nprint(os.getuid(), sorted(os.listdir('/')), os.getcwd())")
    uid, *_ = result.stdout.split()
    assert result.passed and result.stdout.rstrip().endswith("/scratch")
    assert "work" not in result.stdout and "root" not in result.stdout.split("]")[0]
    assert _sandbox_user(int(uid)) or uid == "0"  # 0 where only a user namespace is possible


def test_programs_at_once_each_have_their_own_process_limit() -> None:
    """verl's reward loop (and TRL's step, eval) score samples at once. As nobody, every
    sandbox's processes counted against one limit of 4: a right program that started
    beside others failed to start and scored 0 (2 of 4, 6 of 8)."""
    from concurrent.futures import ThreadPoolExecutor

    if run_python("import os\nprint(os.getuid())").stdout.strip() == "0":
        pytest.skip("a user namespace: the limit counts the calling user's processes")
    program = "```python\nimport time\ndef add(a, b):\n    time.sleep(1)\n    return a + b\n```"
    with ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(lambda _: code_tests("code_tests", program, TESTS), range(8)))
    assert scores == [1.0] * 8


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
    # Nothing of theirs runs on: no process of a sandbox's user is left (not even a zombie).
    assert _sandbox_processes() == []
    server.close()
