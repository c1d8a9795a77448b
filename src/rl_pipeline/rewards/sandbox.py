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
- the program itself runs as ``nobody`` with no capabilities and ``no_new_privs``
  (``setpriv``), under resource limits (``prlimit``): address space, CPU seconds, processes
  (a fork bomb hits the limit), file size; and a wall-clock limit from here.

It needs root, or unprivileged user namespaces (then the program runs as the namespace's
root mapped to the calling user, and the process limit counts that user's processes):
:func:`sandbox_problem` says when neither works.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class SandboxLimits:
    """What one program may use."""

    timeout_s: float = 10.0  # wall clock, from outside
    memory_mb: int = 512  # address space (RLIMIT_AS)
    cpu_s: int = 10  # CPU time (RLIMIT_CPU)
    processes: int = 32  # processes of the sandbox's user (RLIMIT_NPROC)
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
# the program as nobody. $1: the new root (an empty folder), $2: the scratch folder's files.
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
        drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        return ["unshare", *namespaces], drop
    # No root: a user namespace, where only our own uid is mapped (to root there).
    return ["unshare", "--user", "--map-root-user", *namespaces], [
        "setpriv", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]


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


def run_python(code: str, limits: SandboxLimits = SandboxLimits(),
               files: dict[str, str] | None = None) -> SandboxResult:
    """Run ``code`` (as ``/scratch/main.py``, with ``files`` beside it) in the sandbox.

    The program's working folder is ``/scratch``; it sees nothing of the host but ``/usr``
    and ``/etc``, read-only. Its output is capped at 64 kB each.
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
        command = [*unshare, "sh", "-c", _SETUP, "sandbox", str(root), str(staged), *drop,
                   *limit, "/usr/bin/env", "-i", "PATH=/usr/bin", "HOME=/scratch",
                   "sh", "-c", f"cd /scratch && exec {PYTHON} -I -S main.py"]
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                     "SCRATCH_MB": str(limits.scratch_mb)},
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=limits.timeout_s)
            timed_out, code_ = False, proc.returncode
        except subprocess.TimeoutExpired:
            _kill_namespace(proc)
            out, err = proc.communicate()
            timed_out, code_ = True, None
    return SandboxResult(code_, out.decode("utf-8", "replace")[:65536],
                         err.decode("utf-8", "replace")[:65536], timed_out,
                         round(time.perf_counter() - started, 3))


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


def code_tests(data_source: str, solution_str: str, ground_truth: str,
               extra_info: dict | None = None) -> float:
    """1.0 when the response's program passes the ground truth's tests (MBPP-style
    ``assert`` lines, with any set-up they need) run after it in the sandbox, else 0: a
    failed test, an error, a timeout or a limit hit. The program never runs outside the
    sandbox (:func:`run_python`)."""
    program = program_from_response(solution_str)
    result = run_python(f"{program}\n\n# --- the tests ---\n{ground_truth}\n",
                        SandboxLimits(timeout_s=5.0, cpu_s=5))
    return 1.0 if result.passed else 0.0
