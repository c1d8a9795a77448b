"""Stop a test's `kedro run` process at an exact point, so that the test can kill it there.

Python imports ``sitecustomize`` at start-up from the path; the tests put this folder on
``PYTHONPATH`` of the processes they start, and only those. ``RL_TEST_STOP_AT`` names the
point as ``<event>:<glob>``: ``open-write`` (a file opened for writing) or ``rename`` (a
rename or replace, matched on the destination), and a glob matched against the path. At the
first match the process writes ``RL_TEST_STOP_MARKER`` and stops itself (SIGSTOP), in the
middle of what it was doing; the test then looks at the files and kills it (SIGKILL) or lets
it go on (SIGCONT). Python's audit hooks see every open and rename the process makes from
Python, the project's code and its libraries' alike, with no change to either.
"""

import fnmatch
import os
import signal
import sys

_SPEC = os.environ.get("RL_TEST_STOP_AT")

if _SPEC:
    _EVENT, _, _GLOB = _SPEC.partition(":")
    _MARKER = os.environ["RL_TEST_STOP_MARKER"]
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT
    _done = False

    def _path(event, args):
        if event == "open" and _EVENT == "open-write":
            path, mode, flags = args
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else (
                isinstance(flags, int) and flags & _WRITE)
            return path if writing else None
        if event == "os.rename" and _EVENT == "rename":
            return args[1]
        return None

    def _stop_at(event, args):
        global _done
        if _done or event not in ("open", "os.rename"):
            return
        path = _path(event, args)
        if not isinstance(path, (str, bytes)) or not fnmatch.fnmatch(os.fsdecode(path), _GLOB):
            return
        _done = True  # before the marker's own open comes through here
        with open(_MARKER + ".tmp", "w") as marker:
            marker.write(f"{os.getpid()} {event} {os.fsdecode(path)}\n")
        os.rename(_MARKER + ".tmp", _MARKER)
        os.kill(os.getpid(), signal.SIGSTOP)

    sys.addaudithook(_stop_at)
