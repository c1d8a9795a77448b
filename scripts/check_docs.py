"""Checks every command that README.md and docs/*.md show against the project as it is, so
that a renamed pipeline, a removed make target, a deleted script, an unknown option or a
misspelled parameter in the docs fails here rather than in a reader's terminal.
``python scripts/check_docs.py`` prints each problem and exits 1 when there is one;
tests/test_docs_commands.py runs the same checks, one test per command.

What counts as a command: each line of a ```bash, ```sh, ```shell, ```console or unlabelled
fenced block (continuation lines joined), the commands of ```crontab blocks and of systemd
``ExecStart=`` lines in ```ini blocks, and every inline code span that starts with
``kedro``, ``make`` or a script of the repository. Any other block must carry a label that
says it is not shell (python, yaml, text, ...).

How each is checked, with the project's own code and nothing stubbed:
- ``kedro ...``: resolved and parsed by Kedro's own command line (``KedroCLI`` of this
  project, plugins included), so an unknown command or option fails, and every ``--params``
  value is read as YAML the way Kedro reads it. For ``kedro run``: each ``--pipelines`` name
  is a registered pipeline, the deprecated ``--pipeline`` is refused, ``--env`` names a folder
  of conf/, and the configuration loads with the ``--params`` given (Kedro's config loader with
  the project's settings) and passes the project's whole-configuration hook, the check every
  run makes before any node: a misspelled parameter or a bad value fails. A ``--params`` key
  outside the parameter files must be a ``runtime_params`` name of the catalog.
- ``make ...``: ``make -n`` with the same targets and variables exits 0, and the ``kedro``
  and script commands it would run are checked as above.
- ``python scripts/<name>.py ...``: the file exists, every option it is given is one its argparse
  parser defines, and ``scripts/`` tools parse the arguments (``ARGS --help`` exits 0).
  ``scripts/scheduled_run.sh STAGE ARGS`` is checked as the ``kedro run`` it runs.
- anything else: its program is in an allow-list, and every repository path it names exists.
Beside the commands: no doc uses ``kedro run --pipeline`` (singular; kedro-viz's own option is
``--pipeline``), and every relative link points at a file and heading that exist.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class DocProblem(Exception):
    """What a doc shows that does not work: the message names the command and why."""


DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
# Blocks that are not shell: nothing in them runs as a command (crontab and ini: see below).
OTHER_LANGS = {"python", "yaml", "yml", "text", "json", "toml", "ini", "crontab", "jinja",
               "markdown", "diff"}
# Programs a command may start with besides kedro, make, python and the repository's scripts.
ALLOWED_PROGRAMS = {
    "airflow", "apt-get", "awk", "bash", "cd", "curl", "do", "done", "echo", "export", "for",
    "git", "grep", "pip",
    "hostname", "journalctl", "mlflow", "nvidia-smi", "ray", "scontrol", "set", "sleep",
    "source", "srun", "sudo", "systemctl",
}
KEDRO = {"kedro", ".venv/bin/kedro", "$(BIN)/kedro"}
PYTHON = {"python", "python3", ".venv/bin/python", "$(BIN)/python", ".venv-airflow/bin/python"}
# Top-level folders whose paths, when a command names them, must exist in the repository.
TRACKED = {"scripts", "docs", "conf", "requirements", "templates", "src", "tests", "benchmarks",
           ".ci", "data/01_raw/gsm8k"}
# What make's own command line passes down to a child make: never into the dry runs here.
MAKE_ENV = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "ARGS", "ENV", "PIPELINE",
            "FREEZE", "PYTHON", "KEDRO_ENV"}


@dataclass(frozen=True)
class Command:
    doc: str  # path relative to the project root
    line: int
    text: str
    kind: str  # "shell", "inline", "crontab" or "systemd"
    env: tuple[tuple[str, str], ...] = ()  # environment a systemd unit sets

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


# ---------------------------------------------------------------------------- extraction

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the block's first line, lines) of each fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append((lang.lower(), i + 2, body))
        i = j + 1
    return blocks


def strip_fenced(text: str) -> str:
    """The text with each fenced block's lines blanked (line numbers kept)."""
    out, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(2)[:3]
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def logical_lines(body: list[str], first: int) -> list[tuple[int, str]]:
    """Continuation lines joined; blank lines and whole-line comments dropped."""
    result, pending, start = [], "", first
    for number, line in enumerate(body, start=first):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full.startswith("$ "):
            full = full[2:]
        if full and not full.startswith("#"):
            result.append((start, full))
    return result


INLINE_COMMAND = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:(?:\.venv/bin/)?kedro|make|(?:\.venv/bin/)?python3? "
    r"scripts/\S+|scripts/\S+\.(?:sh|py))\s+\S")


def extract(doc: Path) -> list[Command]:
    rel, text = str(doc.relative_to(PROJECT_ROOT)), doc.read_text()
    commands = []
    for lang, first, body in fenced_blocks(text):
        if lang in SHELL_LANGS:
            commands += [Command(rel, n, line, "shell") for n, line in logical_lines(body, first)]
        elif lang == "crontab":
            for n, line in logical_lines(body, first):
                fields = line.split(None, 5)
                commands.append(Command(rel, n, fields[5] if len(fields) == 6 else line,
                                        "crontab"))
        elif lang == "ini":
            env = tuple(tuple(m.group(1).split("=", 1)) for line in body
                        if (m := re.match(r"Environment=(\w+=\S*)", line.strip())))
            commands += [Command(rel, n, line.split("=", 1)[1], "systemd", env)
                         for n, line in enumerate(body, start=first)
                         if line.startswith("ExecStart=")]
    prose = strip_fenced(text)
    for match in re.finditer(r"(`+)(.+?)\1", prose, re.S):
        span = " ".join(match.group(2).split())
        if INLINE_COMMAND.match(span):
            line = prose.count("\n", 0, match.start()) + 1
            commands.append(Command(rel, line, span, "inline"))
    return commands


def all_commands() -> list[Command]:
    return [command for doc in DOCS for command in extract(doc)]




def unique_ids(commands: list[Command]) -> list[str]:
    seen: dict[str, int] = {}
    ids = []
    for command in commands:
        seen[command.id] = seen.get(command.id, 0) + 1
        ids.append(command.id if seen[command.id] == 1 else f"{command.id}#{seen[command.id]}")
    return ids


# ---------------------------------------------------------------------------- shell words

def placeholder(word: str) -> bool:
    """A value the reader fills in: <name>, $VAR, ..., make's $(VAR), or a NAME in capitals."""
    return bool(re.search(r"<[^>]*>|\$|\.\.\.", word) or re.fullmatch(r"[A-Z][A-Z_]+", word))


def segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at | & ; && || and parentheses), without
    redirections."""
    line = re.sub(r"(?<![<\w-])\d?>>?\s*&?[^\s<]+", " ", line)  # > file, >>file, 2>&1
    line = re.sub(r"\$\((\w+)\)", r"<\1>", line)  # make's $(ENV): a placeholder
    line = re.sub(r"=\.\.\.(?=[\s,'\"]|$)", "=<value>", line)  # NAME=... (YAML: '...' ends a doc)
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;()")
    lexer.whitespace_split = True
    result: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set("|&;()"):
            result.append([])
        elif token != "$":
            result[-1].append(token)
    return [words for words in result if words]


def split_assignments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        name, _, value = words[0].partition("=")
        env[name] = value
        words = words[1:]
    return env, words


def repo_paths(words: list[str]) -> list[str]:
    """The words (or option and variable values) that name a path in a tracked folder."""
    paths = []
    for word in words:
        for value in (word, word.split("=", 1)[-1]):
            value = value.removeprefix("./")
            if placeholder(value) or value.startswith(("/", "~", "-")) or "/" not in value:
                continue
            if any(value == top or value.startswith(top + "/") for top in TRACKED):
                paths.append(value.rstrip("/"))
    return paths


def check_paths(words: list[str]) -> None:
    for path in repo_paths(words):
        if not list(PROJECT_ROOT.glob(path)):
            raise DocProblem(f"{path}: no such file or folder in the repository")


# ---------------------------------------------------------------------------- kedro

@functools.cache
def kedro_cli() -> click.Command:
    from kedro.framework.cli.cli import KedroCLI

    return KedroCLI(PROJECT_ROOT)  # bootstraps the project, loads the plugins' commands


@functools.cache
def registered_pipelines() -> frozenset[str]:
    kedro_cli()
    from kedro.framework.project import pipelines

    return frozenset(pipelines)


def parse_kedro(args: list[str]) -> tuple[str, dict[str, Any]]:
    """Kedro's own parse of ``kedro ARGS``: the command's path and its parameters."""
    group = kedro_cli()
    ctx = click.Context(group, info_name="kedro")
    path, rest = [], list(args)
    command: click.Command = group
    while hasattr(command, "resolve_command"):
        if not rest or rest[0].startswith("-"):
            raise DocProblem(f"kedro {' '.join(path)}: no command given")
        try:
            name, sub, rest = command.resolve_command(ctx, rest)
        except click.UsageError as exc:
            raise DocProblem(f"kedro {' '.join([*path, rest[0]])}: "
                                 f"{exc.format_message()}") from None
        if sub is None:
            raise DocProblem(f"kedro has no command {' '.join([*path, rest[0]])}")
        path.append(name)
        ctx = click.Context(sub, info_name=name, parent=ctx)
        command = sub
    try:
        parsed = command.make_context(path[-1], rest, parent=ctx.parent)
    except click.ClickException as exc:
        raise DocProblem(f"kedro {' '.join(path)}: {exc.format_message()}") from None
    except Exception as exc:  # a --params value that is not YAML, say
        raise DocProblem(f"kedro {' '.join(path)}: {type(exc).__name__}: {exc}") from None
    return " ".join(path), parsed.params


def check_env(env: str | None) -> str:
    env = env or "local"
    if not placeholder(env):
        if not (PROJECT_ROOT / "conf" / env).is_dir():
            raise DocProblem(f"--env {env}: no folder conf/{env}")
    return env


def check_pipelines(names: list[str] | tuple[str, ...]) -> None:
    for name in names:
        if not placeholder(name):
            if name not in registered_pipelines():
                raise DocProblem(f"{name!r} is not a registered pipeline: "
                                 f"{sorted(registered_pipelines())}")


def runtime_param_names(env: str) -> set[str]:
    names = set()
    for folder in {"base", env}:
        for path in (PROJECT_ROOT / "conf" / folder).glob("catalog*.yml"):
            names |= set(re.findall(r"\$\{runtime_params:\s*([\w.]+)", path.read_text()))
    return names


def check_run_config(env: str, params: dict[str, Any], load_versions: dict[str, str]) -> None:
    problem = _check_run_config(env, json.dumps(params, sort_keys=True, default=str),
                                json.dumps(load_versions, sort_keys=True))
    if problem is not None:
        raise DocProblem(problem)


@functools.cache
def _check_run_config(env: str, params_json: str, load_versions_json: str) -> str | None:
    """None if the configuration of ``--env env --params ...`` loads and passes the project's
    whole-configuration check; else what is wrong. Cached: many commands share one."""
    from kedro.framework.context import KedroContext
    from kedro.framework.hooks.manager import _create_hook_manager
    from kedro.framework.project import settings

    from rl_pipeline.hooks import WholeConfigurationHook

    params, load_versions = json.loads(params_json), json.loads(load_versions_json)
    conf = str(PROJECT_ROOT / settings.CONF_SOURCE)

    def loader(runtime: dict) -> Any:
        return settings.CONFIG_LOADER_CLASS(conf_source=conf, env=env, runtime_params=runtime,
                                            **settings.CONFIG_LOADER_ARGS)

    in_files = loader({})["parameters"]
    catalog_names = runtime_param_names(env)
    for key in params:
        if key in in_files:
            continue  # a group: its names and values are the hook's to check
        if placeholder(key) or re.fullmatch(r"[A-Z_]+", key):
            continue  # NAME=... in a sentence
        if key not in catalog_names:
            return (f"--params {key}: neither a parameter in conf/base or conf/{env} "
                    f"({sorted(in_files)}) nor a catalog runtime parameter "
                    f"({sorted(catalog_names)})")
        if isinstance(params[key], dict):
            return f"--params {key}.*: {key} is a catalog runtime parameter, not a group"
    config = loader(params)
    try:
        catalog = config["catalog"]  # resolves every ${runtime_params:...}
        context = KedroContext(project_path=PROJECT_ROOT, config_loader=config, env=env,
                               package_name="rl_pipeline", hook_manager=_create_hook_manager(),
                               runtime_params=params)
        WholeConfigurationHook().after_context_created(context)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    unknown = sorted(set(load_versions) - set(catalog))
    if unknown:
        return f"--load-versions: no catalog entry {unknown}"
    return None


def check_kedro(args: list[str], env_vars: dict[str, str] | None = None) -> None:
    path, params = parse_kedro(args)
    if path == "run":
        if params["pipeline"]:
            raise DocProblem("kedro run --pipeline is deprecated in Kedro 1.7: use --pipelines")
        check_pipelines(params["pipelines"] or ["__default__"])
        env = check_env(params["env"] or (env_vars or {}).get("KEDRO_ENV"))
        if not placeholder(env):
            check_run_config(env, params["params"], params["load_versions"] or {})
    elif path == "viz run":
        check_pipelines([params["pipeline"]] if params["pipeline"] else [])
        check_env(params["env"])
    elif path == "airflow create":
        names = params.get("pipelines") or []
        check_pipelines(names.split(",") if isinstance(names, str) else names)
        check_env(params["env"])
    elif "env" in params:
        check_env(params["env"])


# ---------------------------------------------------------------------------- make, scripts

def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in MAKE_ENV}


def check_make(words: list[str]) -> None:
    targets = [w for w in words if "=" not in w and not w.startswith("-")]
    assigns = [w for w in words if "=" in w]
    result = subprocess.run(["make", "-n", *targets, *assigns], cwd=PROJECT_ROOT,
                            env=clean_env(), capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise DocProblem(f"make -n {' '.join(words)}: {result.stderr.strip()}")
    check_paths(assigns)
    for line in result.stdout.replace("\\\n", " ").splitlines():
        for segment in segments(line):
            _, program = split_assignments(segment)
            if program and (program[0].endswith("/kedro") or program[0].endswith("/python")):
                check_program(program, {})
            elif program and program[0].endswith("/pytest"):
                check_paths(program[1:])


def argparse_options(script: Path) -> set[str] | None:
    """The option strings of the script's argparse parser, read from its source (None: no
    argparse)."""
    tree = ast.parse(script.read_text())
    options, uses_argparse = set(), False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "ArgumentParser":
                uses_argparse = True
            if node.func.attr == "add_argument":
                options |= {a.value for a in node.args
                            if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return options | {"-h", "--help"} if uses_argparse else None


def check_script(script: str, args: list[str]) -> None:
    path = PROJECT_ROOT / script
    if not path.is_file():
        raise DocProblem(f"{script}: no such script")
    check_paths(args)
    if path.suffix != ".py":
        return
    options = argparse_options(path)
    if options is None:
        if args:
            raise DocProblem(f"{script} takes no arguments (no argparse), given {args}")
        return
    given = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    if not given <= options:
        raise DocProblem(f"{script}: unknown options {sorted(given - options)}")
    if script.startswith("scripts/") and not any(placeholder(a) for a in args):
        result = subprocess.run([sys.executable, str(path), *args, "--help"], cwd=PROJECT_ROOT,
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise DocProblem(f"{script} {' '.join(args)}: {result.stderr[-500:]}")


def scheduled_run(args: list[str], env_vars: dict[str, str]) -> None:
    """scripts/scheduled_run.sh STAGE [kedro run options], as the kedro run it starts."""
    if not args:
        raise DocProblem("scripts/scheduled_run.sh needs a STAGE")
    stage, rest = args[0], args[1:]
    env = env_vars.get("KEDRO_ENV", "cpu")
    check_kedro(["run", "--pipelines", stage, "--env", env, *rest])


def repository_script(program: str) -> str | None:
    """The repository-relative path of a script named by a path (also an installed copy's:
    /srv/rl_pipeline/scripts/x.sh)."""
    match = re.search(r"(?:^|/)((?:scripts|benchmarks)/[\w.-]+)$", program)
    return match.group(1) if match else None


def check_program(words: list[str], env_vars: dict[str, str], cloned: set[str] | None = None,
                  ) -> None:
    program, args = words[0], words[1:]
    if program in KEDRO:
        check_kedro(args, env_vars)
    elif program in PYTHON or program.endswith("/python"):
        if args[:2] == ["-m", "kedro"]:
            check_kedro(args[2:], env_vars)
        elif args and not args[0].startswith("-"):
            check_script(args[0].removeprefix("./"), args[1:])
        else:
            if args[:1] not in (["-m"], ["-c"]):
                raise DocProblem(f"{program} {args}: what runs?")
    elif program == "make":
        check_make(args)
    elif script := repository_script(program):
        if script == "scripts/scheduled_run.sh":
            check_script(script, [])
            scheduled_run(args, env_vars)
        else:
            check_script(script, args)
    elif program == "bash" and args and (script := repository_script(args[0])):
        check_program([script, *args[1:]], env_vars, cloned)
    elif program == "sudo":
        check_program(args, env_vars, cloned)
    elif program == "cd":
        target = args[0] if args else "~"
        if not (placeholder(target) or target.startswith(("/", "~"))
                or target in (cloned or ()) or (PROJECT_ROOT / target).is_dir()):
            raise DocProblem(f"cd {target}: no such folder")
    else:
        if program not in ALLOWED_PROGRAMS:
            raise DocProblem(f"{program!r}: not a program the docs may name "
                             "(scripts/check_docs.py, ALLOWED_PROGRAMS), nor a script of the "
                             "repository")
        check_paths(args)
        if program == "git" and args[:1] == ["clone"] and cloned is not None:
            url = [a for a in args[1:] if not a.startswith("-")]
            cloned.add(url[1] if len(url) > 1 else url[0].rstrip("/").split("/")[-1]
                       .removesuffix(".git"))


def check_command(command: Command, cloned: set[str] | None = None) -> None:
    env_vars = dict(command.env)
    for segment in segments(command.text):
        assigned, words = split_assignments(segment)
        env_vars.update(assigned)
        check_paths(list(assigned.values()))
        if words and words[0] == "export":
            for word in words[1:]:
                env_vars.update([word.split("=", 1)] if "=" in word else [])
            continue
        if words:
            check_program(words, env_vars, cloned)


def paragraphs(text: str) -> list[tuple[int, str]]:
    """Prose paragraphs, and each line of a fenced block on its own, with line numbers."""
    result, current, start, fence = [], [], 1, None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(2)[:3]
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            else:
                result.append((number, line))
            continue
        if line.strip():
            if not current:
                start = number
            current.append(line)
        elif current:
            result.append((start, "\n".join(current)))
            current = []
    if current:
        result.append((start, "\n".join(current)))
    return result


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found, counts = set(), {}
    for line in strip_fenced(doc.read_text()).splitlines():
        if match := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(match.group(1))
            counts[base] = counts.get(base, -1) + 1
            found.add(base if counts[base] == 0 else f"{base}-{counts[base]}")
    return found


def broken_links() -> list[str]:
    """Relative links of the docs to files or headings that do not exist."""
    broken = []
    for doc in DOCS:
        prose = strip_fenced(doc.read_text())
        prose = re.sub(r"(`+).+?\1", "", prose, flags=re.S)
        for match in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            where = f"{doc.relative_to(PROJECT_ROOT)}: {target}"
            if not path.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where} (no such heading)")
    return broken


def unlabelled_blocks() -> list[str]:
    """Fenced blocks whose label says neither shell nor another known language."""
    return [f"{doc.relative_to(PROJECT_ROOT)}:{line} ```{lang}"
            for doc in DOCS for lang, line, _ in fenced_blocks(doc.read_text())
            if lang not in SHELL_LANGS | OTHER_LANGS]


def deprecated_pipeline_options() -> list[str]:
    """`--pipeline X` is deprecated in Kedro 1.7's `kedro run`; kedro-viz's `--pipeline` is
    its own option, so it may appear where the line (or the paragraph) is about kedro-viz."""
    found = []
    for doc in DOCS:
        for number, paragraph in paragraphs(doc.read_text()):
            for match in re.finditer(r"--pipeline(?![\w-])", paragraph):
                if "viz" not in paragraph:
                    line = number + paragraph.count("\n", 0, match.start())
                    found.append(f"{doc.relative_to(PROJECT_ROOT)}:{line}")
    return found


def problems() -> list[str]:
    """Every problem of the docs, each naming where it is."""
    os.environ.pop("KEDRO_ENV", None)  # a command without --env means conf/local
    found = [f"{c.id}: {c.text}\n{p}" for c in all_commands()
             if (p := command_problem(c, cloned=set()))]
    found += [f"broken link {b}" for b in broken_links()]
    found += [f"label this block with a known language: {b}" for b in unlabelled_blocks()]
    found += [f"use --pipelines (Kedro 1.7): {f}" for f in deprecated_pipeline_options()]
    return found


def command_problem(command: Command, cloned: set[str] | None = None) -> str | None:
    """What is wrong with ``command``, or None."""
    try:
        check_command(command, cloned)
    except DocProblem as exc:
        return str(exc)
    return None


def main() -> int:
    found = problems()
    for problem in found:
        print(problem, end="\n\n")
    print(f"check_docs: {len(found)} problem(s) in {len(DOCS)} docs")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
