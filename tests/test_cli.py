"""`kedro run` splits a request for several whole stages into one session per stage, and
names the --params item and the quoting that works where Kedro would fail with a YAML error."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from rl_pipeline.cli import run, stages_to_run
from rl_pipeline.pipeline_registry import STAGES


def test_the_default_pipeline_runs_each_stage_in_order() -> None:
    assert stages_to_run(None, [], {}) == list(STAGES) == [
        "data_prep", "train", "merge", "eval", "promote"]
    assert stages_to_run("__default__", [], {}) == list(STAGES)
    # --pipelines takes any order (Kedro keeps a set); stages still run in pipeline order.
    assert stages_to_run(None, ["eval", "data_prep"], {}) == ["data_prep", "eval"]


def test_one_stage_other_pipelines_and_node_filters_run_as_kedro_does() -> None:
    assert stages_to_run("train", [], {}) is None
    assert stages_to_run(None, ["preflight"], {}) is None
    assert stages_to_run(None, ["data_prep", "preflight"], {}) is None
    assert stages_to_run(None, [], {"from_nodes": ["merge_model_node"]}) is None
    assert stages_to_run(None, [], {"tags": ("x",), "node_names": ()}) is None
    assert stages_to_run(None, [], {"tags": (), "node_names": ()}) == list(STAGES)


def _params(monkeypatch, value: str):
    """`kedro run --params value` up to the run itself: the exit code, stderr and the
    parameters the run would get."""
    seen: dict = {}
    monkeypatch.setattr("rl_pipeline.cli._run_stages", lambda **options: seen.update(options))
    result = CliRunner().invoke(run, ["--pipelines", "data_prep", "--params", value])
    return result.exit_code, result.stderr, seen.get("params")


def test_a_params_value_that_is_not_yaml_names_the_item_and_the_quoting_that_works(
        monkeypatch) -> None:
    code, stderr, params = _params(monkeypatch, "data_prep.seed=3,"
                                   "data_prep.prompt_template={Body} {Question}")
    assert code == 2 and params is None  # a usage error: nothing runs
    assert ("Error: Invalid value for '--params': data_prep.prompt_template={Body} {Question}: "
            "Kedro reads each --params value as YAML, and '{' starts a YAML mapping; this one "
            "is not YAML (expected '<document start>', but found '{' at column 8). For the "
            "text as it is, quote the value inside the shell's quotes: --params "
            """'data_prep.prompt_template="{Body} {Question}"'""") in stderr
    # ... and that quoting gives the template as text.
    code, stderr, params = _params(monkeypatch, 'data_prep.prompt_template="{Body} {Question}"')
    assert code == 0 and params == {"data_prep": {"prompt_template": "{Body} {Question}"}}
    assert stderr == ""


def test_a_comma_in_a_params_value_is_named(monkeypatch) -> None:
    code, stderr, _ = _params(monkeypatch, "data_prep.prompt_template={Body}, {Question}")
    assert code == 2
    assert "--params splits its value at every comma, quoted or not, and '{Question}' has " \
           "no key=" in stderr


def test_a_params_value_read_as_a_mapping_by_accident_is_warned_of(monkeypatch) -> None:
    code, stderr, params = _params(monkeypatch, "data_prep.prompt_template=Solve: {question}")
    assert code == 0  # it may be meant; validation refuses it if the parameter takes text
    assert params == {"data_prep": {"prompt_template": {"Solve": {"question": None}}}}
    assert ("Kedro reads the value as YAML, which makes it the mapping {'Solve': {'question': "
            "None}}. For the text, quote it: --params "
            """'data_prep.prompt_template="Solve: {question}"'""") in stderr
    code, stderr, params = _params(monkeypatch, "data_prep.seed=7,train.x={a: 1}")
    assert code == 0 and stderr == "" and params == {"data_prep": {"seed": 7},
                                                     "train": {"x": {"a": 1}}}


def test_the_command_typed_is_given_to_the_stages_and_not_left_behind(monkeypatch) -> None:
    """Each stage's run is tagged with this process's command line (LineageHook), and a
    run in this process does not leave it for the next one (or a child) to inherit."""
    import os
    import shlex
    import sys

    from rl_pipeline.runs.command import COMMAND_ENV

    monkeypatch.delenv(COMMAND_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["/venv/bin/kedro", "run", "--env", "cpu"])
    seen: list[str | None] = []
    monkeypatch.setattr("rl_pipeline.cli._run_stages",
                        lambda **_: seen.append(os.environ.get(COMMAND_ENV)))
    assert CliRunner().invoke(run, ["--pipelines", "data_prep"]).exit_code == 0
    assert seen == [shlex.join(["kedro", "run", "--env", "cpu"])]
    assert COMMAND_ENV not in os.environ


def test_one_execution_id_for_a_commands_stages_and_none_left_for_the_next(
        monkeypatch) -> None:
    """The stages of one `kedro run` share a pipeline execution id; a second command in the
    same process (a notebook) gets its own, and a scheduler's id is kept as it was given."""
    import os

    from rl_pipeline.cli import kedro_run
    from rl_pipeline.hooks import EXECUTION_ID_ENV

    monkeypatch.delenv(EXECUTION_ID_ENV, raising=False)
    seen: list[tuple[str, str | None]] = []
    monkeypatch.setattr(kedro_run, "callback", lambda **options: seen.append(
        (options["pipelines"][0], os.environ.get(EXECUTION_ID_ENV))))

    def ids() -> list[str | None]:
        seen.clear()
        assert CliRunner().invoke(run, ["--pipelines", "data_prep,train"]).exit_code == 0
        assert [stage for stage, _ in seen] == ["data_prep", "train"]
        return [execution for _, execution in seen]

    first, second = ids(), ids()
    assert first[0] and first[0] == first[1] and second[0] == second[1] != first[0]
    assert EXECUTION_ID_ENV not in os.environ
    monkeypatch.setenv(EXECUTION_ID_ENV, "airflow-run-7")
    assert ids() == ["airflow-run-7", "airflow-run-7"]
    assert os.environ[EXECUTION_ID_ENV] == "airflow-run-7"


@pytest.mark.parametrize(("typed", "stage"), [
    ("kedro run --env cpu --params 'train.trl.max_steps=2,eval.max_prompts=4'",
     "kedro run --env cpu --params train.trl.max_steps=2,eval.max_prompts=4 --pipelines train"),
    ("kedro run --pipelines data_prep,train --env cpu", "kedro run --env cpu --pipelines train"),
    ("kedro run --pipeline=eval --params x=1", "kedro run --params x=1 --pipelines train"),
    ("kedro run -p train --async", "kedro run --async --pipelines train"),
])
def test_one_stage_of_the_typed_command_keeps_its_environment_and_parameters(
        monkeypatch, typed, stage) -> None:
    """What a stage's run tags as its command, and the trl engine writes as its launch."""
    from rl_pipeline.runs.command import COMMAND_ENV, stage_command

    monkeypatch.setenv(COMMAND_ENV, typed)
    assert stage_command("train") == stage
    monkeypatch.delenv(COMMAND_ENV)
    assert stage_command("train") is None  # a scheduler's task: nothing typed


@pytest.fixture
def kedro_logging():
    """Kedro's logging configuration, restored after the test changes it."""
    from kedro.framework.project import LOGGING

    before = dict(LOGGING.data)
    yield
    LOGGING.configure(before)


def test_plain_logs_off_a_terminal_leave_out_debug_records(kedro_logging, capfd,
                                                          monkeypatch) -> None:
    import logging

    from rl_pipeline.plain_output import plain_output_off_a_terminal

    monkeypatch.delenv("KEDRO_LOGGING_CONFIG", raising=False)
    with plain_output_off_a_terminal():  # stdout is captured here: no terminal
        chatty = logging.getLogger("a_library_at_debug")
        monkeypatch.setattr(chatty, "level", logging.DEBUG)
        chatty.debug("Failed to send data")
        chatty.info("worth a line")
    out = capfd.readouterr().out
    assert " INFO a_library_at_debug: worth a line" in out and "Failed to send" not in out


def test_processes_a_run_starts_off_a_terminal_log_plain_lines_and_draw_no_bars(
        kedro_logging, monkeypatch) -> None:
    # Ray's workers and other processes a stage starts: they configure Kedro's logging as
    # they import it (rich, wrapped at 80 columns) and draw tqdm's bars unless told.
    from rl_pipeline.plain_output import plain_output_off_a_terminal, progress_bars_shown

    for name in ("KEDRO_LOGGING_CONFIG", "TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    child = [sys.executable, "-c", "import kedro.framework.project, tqdm; "
             "print('bar drawn' if not tqdm.tqdm(range(3)).disable else 'no bar')"]
    with plain_output_off_a_terminal():
        assert not progress_bars_shown()
        inside = subprocess.run(child, capture_output=True, text=True, timeout=120)
    first, said = inside.stdout.splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO kedro.framework.project: Using "
                        r"'\S+plain_logging.yml' as logging configuration. ?", first), first
    assert said == "no bar"
    # Afterwards the environment is as it was: the next command in this process starts clean.
    assert "KEDRO_LOGGING_CONFIG" not in os.environ and "TQDM_DISABLE" not in os.environ
