"""A user error (a bad parameter, record or file) prints its message alone; a bug keeps its
traceback (rl_pipeline.errors, the run command of rl_pipeline.cli)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from kedro.io import DatasetError
from kedro.validation.exceptions import ParameterValidationError

from rl_pipeline.cli import run
from rl_pipeline.data.prompts import DataError
from rl_pipeline.engines.problems import PreflightError, Problem
from rl_pipeline.errors import TRACEBACK_ENV, UserError, user_error, user_message
from rl_pipeline.merge.lora import AdapterError
from rl_pipeline.models.locate import ModelResolutionError
from rl_pipeline.params.base import ConfigError
from rl_pipeline.rewards.self_test import RewardSelfTestError
from rl_pipeline.runs.stage_lock import StageLockedError
from rl_pipeline.runs.staging import StorageError
from rl_pipeline.training_result import TrainingResultError
from tests.conftest import GSM8K_TRAIN
from tests.projects import kedro_run, make_project


def _raised(exc: BaseException, cause: BaseException | None = None,
            context: BaseException | None = None) -> BaseException:
    """``exc`` as ``raise exc from cause``, or a raise while handling ``context``, leaves it."""
    exc.__cause__, exc.__context__ = cause, context or cause
    exc.__suppress_context__ = cause is not None
    return exc


@pytest.mark.parametrize(("cls", "builtin"), [
    (DataError, ValueError), (AdapterError, ValueError),
    (ModelResolutionError, FileNotFoundError), (RewardSelfTestError, ValueError),
    (StageLockedError, RuntimeError)])
def test_the_projects_user_errors_are_user_errors_and_keep_their_builtin_class(
        cls, builtin) -> None:
    error = cls("the message")
    assert isinstance(error, UserError) and isinstance(error, builtin)
    assert user_error(error) is error and user_message(error, error) == "the message"
    storage = StorageError(28, "no space left on device")
    assert isinstance(storage, UserError) and storage.errno == 28


def test_the_parameters_and_training_result_errors_are_user_errors() -> None:
    """Their modules import nothing of the project's, so rl_pipeline.errors names them."""
    for error in (ConfigError("a=1: too big"), PreflightError([Problem("x", 1, "2")]),
                  TrainingResultError("no training_result.json")):
        assert user_error(error) is error


def test_kedro_wrapped_user_errors_count_and_bugs_do_not() -> None:
    missing = _raised(DatasetError("Failed while loading data from dataset X.\n[Errno 2] nf"),
                      cause=FileNotFoundError(2, "nf"))
    assert user_error(missing) is missing
    assert user_error(DatasetError("input file not found: x.jsonl")) is not None
    assert user_error(ParameterValidationError("Parameter validation failed")) is not None
    assert user_error(FileNotFoundError("custom_reward_function.path='r.py': no such file"))
    # A dataset that fails for a bug, and a bug raised while handling a user error, are bugs.
    assert user_error(_raised(DatasetError("Failed while saving"), cause=TypeError("x"))) is None
    assert user_error(_raised(TypeError("oops"), context=DataError("bad record"))) is None
    assert user_error(KeyError("k")) is None and user_error(RuntimeError("r")) is None
    # A wrapper that quotes the user error, with or without `from`, stands for it.
    wrapped = _raised(RuntimeError("stage data_prep: bad record"), context=DataError("bad record"))
    assert isinstance(user_error(wrapped), DataError)
    assert user_message(wrapped, user_error(wrapped)) == "stage data_prep: bad record"
    explicit = _raised(RuntimeError("the stage failed"), cause=ConfigError("a=1: too big"))
    assert user_message(explicit, user_error(explicit)) == "a=1: too big"


def _invoke(monkeypatch, raised: BaseException, **env: str):
    def fail(**options):
        raise raised
    monkeypatch.setattr("rl_pipeline.cli._run_stages", fail)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return CliRunner().invoke(run, ["--pipelines", "data_prep"])


def test_run_prints_a_user_errors_message_and_reraises_a_bug(monkeypatch) -> None:
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    result = _invoke(monkeypatch, DataError("1 bad record(s) in train.jsonl"))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "Error: 1 bad record(s) in train.jsonl", f"({TRACEBACK_ENV}=1 shows the traceback)"]
    bug = _invoke(monkeypatch, TypeError("unsupported operand"))
    assert isinstance(bug.exception, TypeError)  # on to Kedro's CLI, which prints it whole
    asked = _invoke(monkeypatch, DataError("bad"), **{TRACEBACK_ENV: "1"})
    assert isinstance(asked.exception, DataError)


# ---------------------------------------------------------------- real `kedro run`s


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A scratch project whose conf/cpu reads conf/base's JSON Lines inputs (its own
    generated additions out), so that --params dataset_train_split points data_prep at a
    file."""
    project = make_project(tmp_path_factory.mktemp("user_errors"))
    catalog = project / "conf/cpu/catalog.yml"
    entries = yaml.safe_load(catalog.read_text())
    for name in ("raw_train", "raw_val"):
        entries.pop(name)
    catalog.write_text(yaml.safe_dump(entries))
    lines = GSM8K_TRAIN.read_text(encoding="utf-8").splitlines()[:4]
    (project / "bad.jsonl").write_text("\n".join([*lines[:2], '{"question": "cut off',
                                                  *lines[2:]]) + "\n")
    (project / "broken_reward.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0\n\n\nSCALE = 1 / 0\n")
    return project


def _data_prep(project: Path, params: str):
    result = kedro_run(project, "--pipelines", "data_prep", "--params", params)
    return result, result.stdout + result.stderr


def _assert_told_briefly(result, output: str, message: str) -> None:
    assert result.returncode == 1, output
    assert f"Error: {message}" in result.stderr, output
    assert "Traceback" not in output and "╭" not in output, output  # no (rich) traceback
    assert len(output.splitlines()) < 40, output


@pytest.mark.slow
@pytest.mark.parametrize(("params", "message", "detail"), [
    ("data_prep.val_fraction=7", "1 invalid parameter(s) in 'data_prep':",
     "data_prep.val_fraction=7: Input should be less than 1"),
    ("dataset_train_split=bad.jsonl", "1 bad record(s) in ", "bad.jsonl, line 3: malformed JSON"),
    ("dataset_train_split=missing.jsonl", "raw_train: input file not found: ",
     "missing.jsonl (expected a JSON Lines file)"),
    ("dataset_train_splt=bad.jsonl", "--params dataset_train_splt: nothing in --env cpu "
     "reads it", "no catalog entry of conf/base/, conf/cpu/ uses "
     "${runtime_params:dataset_train_splt}"),
    ("data_prep.data_source=apps,reward.self_test=off", "- data_prep.data_source='apps': ",
     "(prime_code) runs the model's generated code on this machine, outside any sandbox"),
    # The spec's name for what the catalog provides here: where it is set instead.
    ("actor_model_path=my/model", "--params actor_model_path: nothing in --env cpu reads it",
     "The spec's actor_model_path is set here as --params base_model=..."),
], ids=["bad_parameter", "bad_record", "missing_file", "unread_name", "code_on_host",
        "spec_input"])
def test_a_user_error_is_told_without_a_traceback(project, params, message, detail) -> None:
    result, output = _data_prep(project, params)
    _assert_told_briefly(result, output, message)
    assert detail in result.stderr


def test_the_reward_functions_own_mistakes_are_user_errors(tmp_path) -> None:
    """No such function, or other arguments: user errors, which `kedro run` tells without a
    traceback (as the cases above show); a file that fails to import is the user's bug, whose
    traceback shows the line (test_a_bug_keeps_its_traceback)."""
    from rl_pipeline.rewards.scoring import load_reward_function

    rewards = tmp_path / "two_rewards.py"
    rewards.write_text("def brevity(solution_str):\n    return 0.5\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(str(rewards), "score")
    assert user_error(err.value) is err.value
    assert str(err.value) == (f"reward.custom_reward_function.name='score' is not a function in "
                              f"{rewards}; functions found: brevity")
    with pytest.raises(ValueError) as err:
        load_reward_function(str(rewards), "brevity")
    assert user_error(err.value) is err.value
    assert str(err.value) == (f"reward.custom_reward_function.name='brevity' in {rewards} must "
                              "accept (data_source, solution_str, ground_truth, "
                              "extra_info=None): too many positional arguments")
    rewards.write_text("import no_such_module_here\n")
    with pytest.raises(ValueError) as err:
        load_reward_function(str(rewards), "brevity")
    assert user_error(err.value) is None


@pytest.mark.slow
def test_a_prompt_template_without_quotes_names_the_quoting_that_works(project) -> None:
    result, output = _data_prep(project, "data_prep.prompt_template={Body} {Question}")
    assert result.returncode == 2, output  # a usage error, before any session
    assert "Traceback" not in output and "ParserError" not in output, output
    assert ("""--params 'data_prep.prompt_template="{Body} {Question}"'""" in result.stderr)


@pytest.mark.slow
def test_a_bug_keeps_its_traceback(project) -> None:
    """A reward file that fails to import is reported as the ValueError it is, with the
    traceback down to the reward file's line."""
    result, output = _data_prep(project, "reward.custom_reward_function.path=broken_reward.py,"
                                         "reward.custom_reward_function.name=score")
    assert result.returncode == 1, output
    assert "Traceback" in result.stderr and "ZeroDivisionError" in result.stderr, output
    assert "broken_reward.py" in result.stderr
    assert f"{TRACEBACK_ENV}=1 shows" not in result.stderr


@pytest.mark.slow
def test_own_records_under_the_cpu_environment_are_refused_saying_what_to_change(
        tmp_path) -> None:
    """conf/cpu trains on generated additions: its raw_train reads no dataset_train_split,
    so a user's file there would be ignored and the additions trained on."""
    project = make_project(tmp_path)
    result, output = _data_prep(project, "dataset_train_split=my.jsonl")
    _assert_told_briefly(result, output, "--params dataset_train_split: nothing in --env cpu "
                                         "reads it")
    assert ("raw_train and raw_val are generated additions; to train on your own records "
            "here, delete those entries from its catalog.yml") in result.stderr
    assert not (project / "data/05_model_input").exists()  # refused before any node


def test_an_unquoted_off_from_the_command_line_turns_the_self_test_off() -> None:
    """`--params reward.self_test=off`: Kedro's parser reads YAML, where off is false."""
    from kedro.framework.cli.utils import _split_params

    from rl_pipeline.params import RewardParams

    raw = _split_params(None, None, "reward.self_test=off")
    assert raw == {"reward": {"self_test": False}}
    assert RewardParams.model_validate(raw["reward"]).self_test == "off"
    with pytest.raises(ConfigError, match="reward.self_test=True"):
        RewardParams.model_validate({"self_test": True})


def test_the_spec_value_no_for_eval_strategy_is_read_unquoted() -> None:
    """`eval_strategy: no`, the spec's own default, written as a user writes it: YAML reads
    false; it was refused as "Input should be 'no', 'steps' or 'epoch'"."""
    from kedro.framework.cli.utils import _split_params

    from rl_pipeline.params.trl import TrlParams

    raw = _split_params(None, None, "train.trl.eval_strategy=no")
    assert raw == {"train": {"trl": {"eval_strategy": False}}}
    assert TrlParams.model_validate(raw["train"]["trl"]).eval_strategy == "no"
    with pytest.raises(ConfigError, match="train.trl.eval_strategy=True"):
        TrlParams.model_validate({"eval_strategy": True})


def test_an_input_file_beside_dataset_name_is_refused_naming_both() -> None:
    """WholeConfigurationHook refuses these before any node (as unread --params names): the
    raw inputs read the dataset's splits, and the file was ignored without a word."""
    from rl_pipeline.hooks import two_sources

    assert two_sources({"dataset_name": "data/my_dataset",
                        "dataset_validation_split": "val.jsonl"}) == [
        "--params dataset_validation_split=val.jsonl: dataset_name=data/my_dataset is given "
        "too, and the inputs read that dataset's splits (train; validation, else test) in "
        "place of any file: give dataset_name or the files"]
    assert len(two_sources({"dataset_name": "d", "dataset_train_split": "t.jsonl",
                            "dataset_validation_split": "v.jsonl"})) == 2
    assert two_sources({"dataset_name": "d", "dataset_validation_split": ""}) == []
    assert two_sources({"dataset_train_split": "t.jsonl"}) == []


@pytest.mark.slow
def test_a_misspelt_group_in_a_parameters_file_is_refused_naming_the_file(tmp_path) -> None:
    """`data_perp:` in a parameters file: nothing read it, the run went ahead on the
    defaults, and nothing said so (the same name as --params is refused)."""
    project = make_project(tmp_path)
    typo = project / "conf/cpu/parameters_typo.yml"
    typo.write_text("data_perp:\n  dataset_prompt_column: problem\n_anchor: 3\n")
    result, output = _data_prep(project, "data_prep.seed=1")
    _assert_told_briefly(result, output, "conf/cpu/parameters_typo.yml: 'data_perp' is no "
                                         "parameter group (did you mean 'data_prep'?); "
                                         "nothing reads it. The groups: ")
    assert not (project / "data/05_model_input").exists()  # refused before any node
    from kedro.config import OmegaConfigLoader

    from rl_pipeline import settings
    from rl_pipeline.hooks import unknown_groups

    typo.write_text("data_prep:\n  dataset_prompt_column: question\n_anchor: 3\n")
    loader = OmegaConfigLoader(str(project / "conf"), env="cpu", **settings.CONFIG_LOADER_ARGS)
    assert unknown_groups(loader) == []


@pytest.mark.slow
def test_a_login_in_the_tracking_servers_uri_is_refused_before_any_run(tmp_path,
                                                                        monkeypatch) -> None:
    """MLflow prints a server's URI as given when each run ends ("View run ... at:"): a
    password in it went to every stage's log (and through verl into MLflow)."""
    from rl_pipeline.hooks import refuse_credentials_in_server_uris

    project = make_project(tmp_path)
    (project / "conf/cpu/mlflow.yml").write_text(
        "server:\n  mlflow_tracking_uri: http://ci:s3cret@127.0.0.1:9\n")
    result = kedro_run(project, "--pipelines", "data_prep")
    output = result.stdout + result.stderr
    _assert_told_briefly(result, output, "mlflow.yml server.mlflow_tracking_uri="
                         "'http://***@127.0.0.1:9': a URI without credentials.")
    assert "MLFLOW_TRACKING_PASSWORD" in output and "s3cret" not in output
    assert "View run" not in output and not (project / "data/05_model_input").exists()
    # From the environment, where mlflow.yml names no server; a token in the query.
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", "https://registry.internal/?access_token=t0k")
    with pytest.raises(ConfigError, match=r"MLFLOW_REGISTRY_URI='https://registry.internal/"
                                          r"\?access_token=\*\*\*': a URI without"):
        refuse_credentials_in_server_uris({"mlflow_tracking_uri": "sqlite:///mlflow.db"})
    refuse_credentials_in_server_uris({"mlflow_tracking_uri": "http://mlflow.internal:5000",
                                       "mlflow_registry_uri": "sqlite:///registry.db"})



def test_the_spec_name_of_an_input_file_gets_the_environments_own_advice() -> None:
    """Under --env cpu the raw inputs are generated: `dataset_train_split` is read nowhere
    there, so pointing the spec's `data_train_files` at it would be refused in turn."""
    from rl_pipeline.hooks import _own_data_hint

    generated = {"raw_train": {"type": "rl_pipeline.datasets.arithmetic.AdditionDataset"}}
    assert _own_data_hint("data_train_files", generated).startswith(
        ": this environment's raw_train are generated additions (the spec's data_train_files "
        "is dataset_train_split here); to train on your own records here, delete")
    assert _own_data_hint("data_train_files", {}) == (
        ". The spec's data_train_files is set here as --params dataset_train_split=...: the "
        "raw records data_prep makes the prompts of both engines from")
