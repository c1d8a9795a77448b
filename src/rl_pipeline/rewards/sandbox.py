"""Running model-generated code in a sandbox, for rewards that execute it.

A reward that runs what a model wrote must never run it as the trainer: the model's code
could read the project's files or credentials, write anywhere, reach the network, or take
the machine down. Each program runs in Linux namespaces made by util-linux's ``unshare``
(a Debian/Ubuntu base package, present where the project runs; no daemon, no setuid helper
to install), which is what bubblewrap and nsjail build on; neither of those is installed on
the machines this project is built for, and ``unshare`` does the same in a few lines:

- a network namespace with no interface up: no network at all;
- a mount namespace whose root is a fresh, empty tmpfs holding read-only binds of ``/usr``
  (the system's Python and libraries) and ``/etc``, a writable scratch folder (the program
  and its files, a tmpfs of :attr:`SandboxLimits.scratch_mb`), and ``/dev/null``: the
  project, the home folders, ``/tmp`` and every other file of the host are not there;
- a PID namespace (the program cannot see or signal the host's processes; killing its first
  process ends all of them);
- the program itself runs as a user id of its own (:data:`SANDBOX_UIDS`) with no
  capabilities and ``no_new_privs``
  (``setpriv``), under resource limits (``prlimit``): address space per process, CPU
  seconds, processes (a fork bomb hits the limit; 4 processes of 512 MB: 2 GB at most), file
  size, its output included (it goes to files, so a program that prints without end costs
  the host no memory); and a wall-clock limit, kept both from here and inside the namespace
  (``timeout``), so a sandbox whose caller was killed still ends.

It needs root, or unprivileged user namespaces (then the program runs as the namespace's
root mapped to the calling user, and the process limit counts that user's processes):
:func:`sandbox_problem` says when neither works.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

PYTHON = "/usr/bin/python3"  # the system's, not the project's: stdlib only, from /usr
NOBODY = 65534
# With root, each program runs as a user id of its own from this range, no account's
# (RLIMIT_NPROC counts a user's processes: as nobody, four sandboxes at once shared one
# count of 4, and a correct program that started beside others failed to start, scoring 0:
# 2 of 4 at once, 6 of 8).
SANDBOX_UIDS = (1_000_000_000, 1 << 30)  # (first, how many)
_uids = itertools.count()


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use."""

    timeout_s: float = 10.0  # wall clock, from outside
    memory_mb: int = 512  # address space (RLIMIT_AS)
    cpu_s: int = 10  # CPU time (RLIMIT_CPU)
    processes: int = 4  # processes of the sandbox's user (RLIMIT_NPROC); each has memory_mb
    file_mb: int = 16  # largest file it may write (RLIMIT_FSIZE)
    scratch_mb: int = 64  # its writable folder (a tmpfs)


@dataclass(frozen=True)
class SandboxResult:
    """How a program ended."""

    returncode: int | None  # None: killed at the wall-clock limit
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.timed_out


# Run by unshare's new namespaces (as root there) before the program: the new root, then
# the program as its own user. $1: the new root (an empty folder), $2: the scratch folder's files.
_SETUP = textwrap.dedent("""\
    set -eu
    new=$1; files=$2; shift 2
    mount --make-rprivate /
    mount -t tmpfs -o size=4m,mode=755 sandbox "$new"
    mkdir -p "$new/usr" "$new/etc" "$new/scratch" "$new/dev" "$new/proc" "$new/tmp"
    for d in usr etc; do
        mount --rbind "/$d" "$new/$d"
        mount -o remount,bind,ro "$new/$d"
    done
    for l in bin lib lib64 sbin; do [ -e "/$l" ] && ln -s "usr/$l" "$new/$l"; done
    touch "$new/dev/null" && mount --bind /dev/null "$new/dev/null"
    mount -t proc proc "$new/proc"
    mount -t tmpfs -o "size=${SCRATCH_MB}m,mode=1777" scratch "$new/scratch"
    cp -r "$files"/. "$new/scratch/"
    chmod -R a+rX "$new/scratch"
    mount -o remount,ro,bind "$new"
    cd "$new"
    exec chroot "$new" "$@"
""")


def _prefix() -> tuple[list[str], list[str]]:
    """(unshare's arguments, how the program drops privileges) for this machine."""
    namespaces = ["--mount", "--net", "--pid", "--fork", "--kill-child"]
    if os.geteuid() == 0:
        uid = _sandbox_uid()
        drop = ["setpriv", f"--reuid={uid}", f"--regid={NOBODY}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        return ["unshare", *namespaces], drop
    # No root: a user namespace, where only our own uid is mapped (to root there).
    return ["unshare", "--user", "--map-root-user", *namespaces], [
        "setpriv", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]


def _sandbox_uid() -> int:
    """A user id for one program: this process's id and a count, spread over
    :data:`SANDBOX_UIDS`, so that programs running at once, from this process or another,
    have process counts of their own."""
    first, size = SANDBOX_UIDS
    return first + ((os.getpid() << 12) + next(_uids) % 4096) % size


def sandbox_problem() -> str | None:
    """Why programs cannot be sandboxed here, or None when they can (a trial run)."""
    for tool in ("unshare", "setpriv", "prlimit", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux/coreutils) is not on PATH"
    if not Path(PYTHON).is_file():
        return f"{PYTHON} is missing (the sandbox runs the system's Python)"
    result = run_python("print(6 * 7)", SandboxLimits(timeout_s=30))
    if result.stdout.strip() != "42":
        return (f"a trial program did not run in the sandbox (exit {result.returncode}): "
                f"{result.stderr.strip()[-300:]}")
    return None


_KEPT = 65536  # bytes of each output stream kept


def run_python(code: str, limits: SandboxLimits = SandboxLimits(),
               files: dict[str, str] | None = None,
               env: dict[str, str] | None = None) -> SandboxResult:
    """Run ``code`` (as ``/scratch/main.py``, with ``files`` beside it) in the sandbox.

    The program's working folder is ``/scratch``; it sees nothing of the host but ``/usr``
    and ``/etc``, read-only. The last 64 kB of each output stream are kept (it may write up
    to ``file_mb``; past that the file-size limit ends it). ``env``: variables it sees.
    """
    unshare, drop = _prefix()
    limit = ["prlimit", f"--as={limits.memory_mb << 20}", f"--cpu={limits.cpu_s}",
             f"--nproc={limits.processes}", f"--fsize={limits.file_mb << 20}", "--"]
    with tempfile.TemporaryDirectory(prefix="rl-sandbox-") as tmp:
        root, staged = Path(tmp) / "root", Path(tmp) / "files"
        root.mkdir()
        staged.mkdir()
        (staged / "main.py").write_text(code, encoding="utf-8")
        for name, text in (files or {}).items():
            (staged / name).write_text(text, encoding="utf-8")
        # timeout inside the namespace too: should this process be killed (a reward worker
        # past reward.timeout_s), the sandbox, orphaned, still ends at its limit.
        inside = f"{limits.timeout_s + 1:g}"
        command = [*unshare, "sh", "-c", _SETUP, "sandbox", str(root), str(staged), *drop,
                   *limit, "/usr/bin/env", "-i", "PATH=/usr/bin", "HOME=/scratch",
                   *(f"{k}={v}" for k, v in (env or {}).items()), "sh", "-c",
                   f"cd /scratch && exec timeout -s KILL {inside} {PYTHON} -I -S main.py"]
        started = time.perf_counter()
        with open(Path(tmp) / "stdout", "w+b") as out, open(Path(tmp) / "stderr", "w+b") as err:
            proc = subprocess.Popen(command, stdout=out, stderr=err,
                                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                         "SCRATCH_MB": str(limits.scratch_mb)},
                                    start_new_session=True)
            try:
                proc.wait(timeout=limits.timeout_s)
                timed_out, code_ = False, proc.returncode
            except subprocess.TimeoutExpired:
                _kill_namespace(proc)
                timed_out, code_ = True, None
            texts = [_tail(stream) for stream in (out, err)]
    return SandboxResult(code_, texts[0], texts[1], timed_out,
                         round(time.perf_counter() - started, 3))


def _tail(stream) -> str:
    # The end: a traceback's last line, the test harness's closing line.
    stream.seek(max(0, stream.seek(0, os.SEEK_END) - _KEPT))
    return stream.read(_KEPT).decode("utf-8", "replace")


def _kill_namespace(proc: subprocess.Popen) -> None:
    """End a program past its time: SIGKILL to the PID namespace's first process (unshare's
    child), which takes every process of the namespace with it, while unshare lives on to
    reap it (killing unshare too would leave it a zombie for the host's init); then the
    session, should anything be left."""
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        try:
            os.kill(int(child), 9)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)


CODE_FENCE = "```"


def program_from_response(response: str) -> str:
    """The code a response gives: its last fenced block (```python ... ``` or ``` ... ```),
    else the whole response."""
    blocks = response.split(CODE_FENCE)
    if len(blocks) < 3:
        return response
    last = blocks[-2] if len(blocks) % 2 == 1 else blocks[-3]
    first, _, rest = last.partition("\n")
    return rest if first.strip().isidentifier() or not first.strip() else last


# Runs in the sandbox: the program, then the tests in its namespace, then a line only this
# harness knows (a nonce from the environment, taken out before the program runs). A program
# that exits before the tests (sys.exit(0), os._exit(0)) never prints it, and a comparison
# in the tests refuses a value whose type the program defined (an object equal to anything).
_HARNESS = textwrap.dedent("""\
    import ast, os, sys


    def _main(done=os.environ.pop("RL_TESTS_DONE", ""), write=os.write, type_=type,
              all_=all, plain=(int, float, complex, str, bytes, bool, type(None)),
              containers=(list, tuple, set, frozenset)):
        def suspect(value):
            kind = type_(value)
            if kind in plain:
                return False
            if kind in containers:
                return not all_(not suspect(v) for v in value)
            if kind is dict:
                return not all_(not suspect(k) and not suspect(v) for k, v in value.items())
            return getattr(kind, "__module__", None) == "__main__"

        def same(left, right):
            return not suspect(left) and not suspect(right) and left == right

        def contained(left, right):
            return not suspect(left) and left in right

        class Checked(ast.NodeTransformer):
            def visit_Compare(self, node):
                self.generic_visit(node)
                if len(node.ops) != 1:
                    return node
                op, calls = node.ops[0], {ast.Eq: "_rl_same", ast.NotEq: "_rl_same",
                                          ast.In: "_rl_in", ast.NotIn: "_rl_in"}
                name = calls.get(type_(op))
                if name is None:
                    return node
                call = ast.Call(ast.Name(name, ast.Load()),
                                [node.left, node.comparators[0]], [])
                negated = isinstance(op, (ast.NotEq, ast.NotIn))
                return ast.UnaryOp(ast.Not(), call) if negated else call

        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        with open("program.py", encoding="utf-8") as f:
            exec(compile(f.read(), "program.py", "exec"), namespace)
        with open("tests.py", encoding="utf-8") as f:
            tests = ast.parse(f.read(), "tests.py")
        for node in tests.body:
            if isinstance(node, ast.Assert):
                node.test = Checked().visit(node.test)
        namespace.update(_rl_same=same, _rl_in=contained)
        exec(compile(ast.fix_missing_locations(tests), "tests.py", "exec"), namespace)
        sys.stdout.flush()
        write(1, ("\\n" + done + "\\n").encode())


    _main()
""")


def code_tests(data_source: str, solution_str: str, ground_truth: str,
               extra_info: dict | None = None) -> float:
    """1.0 when the response's program passes the ground truth's tests (MBPP-style
    ``assert`` lines, with any set-up they need) run after it in the sandbox, else 0: a
    failed test, an error, a timeout or a limit hit, a program that exits before the tests
    have run, or a tested value of a type the program defined. The program never runs
    outside the sandbox (:func:`run_python`)."""
    import secrets

    done = secrets.token_hex(16)
    result = run_python(_HARNESS, SandboxLimits(timeout_s=5.0, cpu_s=5),
                        files={"program.py": program_from_response(solution_str),
                               "tests.py": f"{ground_truth}\n"},
                        env={"RL_TESTS_DONE": done})
    return 1.0 if result.passed and result.stdout.rstrip().endswith(done) else 0.0
