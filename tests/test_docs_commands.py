"""The docs' commands, links and block labels work (scripts/check_docs.py checks them): one
test per command, so a failure names the doc, the line and the command; and the checker
fails on what rots."""

from __future__ import annotations

import re

import pytest

from tests.conftest import PROJECT_ROOT, load_script

check_docs = load_script("check_docs")
COMMANDS = check_docs.all_commands()


@pytest.fixture(autouse=True)
def _no_kedro_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A doc's command without --env means conf/local, whatever this shell exports."""
    monkeypatch.delenv("KEDRO_ENV", raising=False)


def test_the_docs_show_commands() -> None:
    docs = {c.doc for c in COMMANDS}
    assert {"README.md", "docs/stages.md", "docs/gpu.md", "docs/scheduling.md"} <= docs
    kedro_runs = [c for c in COMMANDS if re.search(r"\bkedro run\b", c.text)]
    assert len(kedro_runs) >= 20 and len(COMMANDS) >= 80
    assert check_docs.PROJECT_ROOT == PROJECT_ROOT


def test_every_fenced_block_says_what_it_holds() -> None:
    assert check_docs.unlabelled_blocks() == []


@pytest.mark.parametrize("command", COMMANDS, ids=check_docs.unique_ids(COMMANDS))
def test_command(command) -> None:
    if problem := check_docs.command_problem(command, cloned=set()):
        pytest.fail(f"{command.id}: {command.text}\n{problem}", pytrace=False)


def test_kedro_run_never_takes_the_deprecated_pipeline_option() -> None:
    assert check_docs.deprecated_pipeline_options() == []


def test_relative_links_point_at_files_and_headings_that_exist() -> None:
    assert check_docs.broken_links() == []


# ---------------------------------------------------------------------------- the checker

@pytest.mark.parametrize(("command", "problem"), [
    ("kedro run --pipelines no_such_stage --env cpu", "not a registered pipeline"),
    ("kedro run --pipeline train --env cpu", "use --pipelines"),
    ("kedro run --pipelines train --env no_such_env", "no folder conf/no_such_env"),
    ("kedro run --pipelines train --no-such-option", "No such option"),
    ("kedro run --pipelines train --env cpu --params train.trl.max_stepz=1", "max_stepz"),
    ("kedro run --pipelines train --env cpu --params train.trl.max_steps=many", "max_steps"),
    ("kedro run --pipelines data_prep --params data_prp.seed=1", "data_prp"),
    ("kedro run --pipelines data_prep --params dataset_trian_split=x.jsonl", "dataset_trian"),
    ("kedro run --pipelines data_prep --params 'data_prep.prompt_template={Body} {Question}'",
     "{Body} {Question}"),
    ("kedro run --pipelines eval --load-versions no_such_dataset:v1", "no_such_dataset"),
    ("kedro vizz run", "No such command"),
    ("make no-such-target", "make -n no-such-target"),
    ("make run ARGS='--params train.trl.no_such=1'", "no_such"),
    ("python scripts/no_such_script.py", "no such script"),
    ("python scripts/pipeline_png.py --no-such-option", "unknown options"),
    ("python scripts/pipeline_png.py --theme no_such_theme", "pipeline_png.py"),
    ("scripts/scheduled_run.sh no_such_stage", "not a registered pipeline"),
    ("rm -rf data", "not a program the docs may name"),
    ("git add conf/no_such_file.yml", "no such file"),
])
def test_the_checker_fails_on_what_rots(command: str, problem: str) -> None:
    with pytest.raises(check_docs.DocProblem) as failure:
        check_docs.check_command(check_docs.Command("test", 0, command, "shell"))
    assert problem in str(failure.value)


def test_the_checker_passes_what_works() -> None:
    for command in (
        "kedro run --pipelines data_prep --params 'data_prep.prompt_template=\"{Body} {Q}\"'",
        "kedro run --env cpu --pipelines preflight --params train.engine=verl",
        "make run PIPELINE=data_prep ARGS=\"--params data.data_max_prompt_length=512\"",
        "python scripts/pipeline_png.py --pipeline train --output /tmp/train.png",
    ):
        check_docs.check_command(check_docs.Command("test", 0, command, "shell"))
