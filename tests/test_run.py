"""End to end: `kedro run` in a scratch copy of the project.

These run the real CLI with the project's configuration (the CPU environment, conf/cpu, as
`make run` picks it on a machine without a GPU, unless a test says otherwise), the real
GSM8K files and the real CPU model (SmolLM2-135M-Instruct from its GGUF), and read the
results the way verl and MLflow will.
"""

from __future__ import annotations

import glob
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from kedro.io.core import Version
from omegaconf import OmegaConf

from rl_pipeline.datasets.model_folder import ModelFolderDataset
from rl_pipeline.engines.forecast import FIRST_STEP_METRIC, GPU_ASSUMPTIONS
from rl_pipeline.evaluation.verdict import HACKING, LEARNED, NO_CHANGE, WORSE
from rl_pipeline.model_card import check_manifest
from rl_pipeline.training_rollouts import PREFIX, TABLE
from tests.conftest import GSM8K_TEST, GSM8K_TRAIN, SMOLLM2_GGUF
from tests.projects import kedro_run, make_project, mlflow_runs, readme_block, run_tags

pytestmark = pytest.mark.slow
# The base configuration's model is a hub id; offline, the GPU-configuration tests use SmolLM2.
SMOLLM2 = f"base_model={SMOLLM2_GGUF}"


def latest(project: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(sorted(glob.glob(str(project / f"data/05_model_input/{name}"
                                                f".parquet/*/{name}.parquet")))[-1])


def data_prep_params(project: Path, env: str = "cpu"):
    """The data_prep group as `kedro run --env <env>` in ``project`` sees it."""
    from kedro.config import OmegaConfigLoader

    from rl_pipeline.params import DataPrepParams

    loader = OmegaConfigLoader(str(project / "conf"), base_env="base", default_run_env=env)
    return DataPrepParams.model_validate(loader["parameters"]["data_prep"])


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_dir):
    from rl_pipeline.models.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    """data_prep of the base configuration (GSM8K), SmolLM2's tokenizer counting tokens."""
    project = make_project(tmp_path_factory.mktemp("default"))
    result = kedro_run(project, "--pipelines", "data_prep", "--params", SMOLLM2, env=None)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return project


def test_default_run_writes_all_gsm8k_prompts_that_verl_loads(default_run, smollm2_tokenizer,
                                                              tmp_path) -> None:
    from verl.utils.dataset.rl_dataset import RLHFDataset

    train, val = latest(default_run, "train_prompts"), latest(default_run, "val_prompts")
    assert (len(train), len(val)) == (7473, 1319)
    for frame, source in ((train, GSM8K_TRAIN), (val, GSM8K_TEST)):
        answers = [json.loads(line)["answer"] for line in source.read_text().splitlines()]
        expected = [re.search(r"#### (\-?[0-9\.\,]+)", a).group(1).replace(",", "")
                    for a in answers]
        assert [rm["ground_truth"] for rm in frame["reward_model"]] == expected
    path = sorted(glob.glob(str(default_run / "data/05_model_input/train_prompts.parquet/*/*")))
    config = OmegaConf.create({"max_prompt_length": 1024, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1,
                               "cache_dir": str(tmp_path / "verl_cache")})
    dataset = RLHFDataset(data_files=[path[-1]], tokenizer=smollm2_tokenizer, config=config)
    assert len(dataset) == 7473
    item = dataset[0]
    instruction = data_prep_params(default_run, env="local").instruction
    assert instruction and item["raw_prompt"][0]["content"].endswith(" " + instruction)


def test_default_run_is_tracked_in_mlflow(default_run) -> None:
    client, runs = mlflow_runs(default_run)
    (run,) = [r for r in runs if r.info.run_name == "data_prep"]
    assert run.info.status == "FINISHED"
    assert run.data.params["data.data_max_prompt_length"] == "1024"
    assert run.data.params["data_prep.dataset_prompt_column"] == "question"
    report = json.loads((default_run / "data/08_reporting/data_prep_report.json").read_text())
    metrics = run.data.metrics
    assert metrics["data_prep.rows_out.train"] == report["rows_out"]["train"] == 7473
    assert metrics["data_prep.prompt_tokens.val.p90"] == report["prompt_tokens"]["val"]["p90"]
    assert metrics["data_prep.dropped.overlong_prompt"] == 0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "data_prep")}
    assert artifacts == {"data_prep/data_prep_report.json",
                         "data_prep/prompt_length_histogram.png"}


def test_preflight_checks_the_default_verl_config_on_a_cpu(default_run, tmp_path) -> None:
    result = kedro_run(default_run, "--pipelines", "preflight", "--params",
                       f"{SMOLLM2},train.forecast=true,train.price_per_device_hour=2.5",
                       env=None)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reporting = default_run / "data/08_reporting"
    report = json.loads((reporting / "preflight_report.json").read_text())
    assert report["engine"] == "verl" and report["training"] is False
    # 8 GPUs that are not here: the forecast is arithmetic, an estimate for an assumed GPU.
    forecast = report["forecast"]
    assert forecast["basis"].startswith("estimate: arithmetic for H100 (no GPU named here")
    assert forecast["devices"] == 8 and forecast["steps"] == 7 * (7473 // 512)
    assert forecast["cost"] == pytest.approx(2.5 * forecast["device_hours"], abs=0.01)
    assert forecast["start_s"] == GPU_ASSUMPTIONS["verl_start_s"]  # verl's, with vLLM
    assert "Forecast (estimate" in result.stdout + result.stderr
    assert report["hardware"] == {"gpus_per_node": 8, "nnodes": 1, "tensor_parallel": 2,
                                  "device": "cuda"}
    assert report["reward"]["openai/gsm8k"]["gold_correct"] == 1.0  # the reward self-test
    # verl's rollout server built the `vllm serve` command and vLLM's parser took all of it.
    assert report["vllm_args"]["unrecognized"] == [] and report["vllm_args"]["vllm"] == "0.24.0"
    assert "--mm_processor_cache_gb" in report["vllm_args"]["argv"]
    config = OmegaConf.load(reporting / "train_config_resolved.yaml")
    assert config.data.train_files == str(sorted(glob.glob(str(
        default_run / "data/05_model_input/train_prompts.parquet/*/*.parquet")))[-1])
    # The checkpoints go to the folder of the run's identity (issue 17).
    assert config.trainer.default_local_dir == str(
        default_run / "data/06_models/train_checkpoints" / report["identity"][:12])
    assert config.data.train_batch_size == 512 and config.actor_rollout_ref.rollout.n == 5
    # The saved command line is verl's own CLI: its overrides compose there too.
    command = shlex.split((reporting / "train_command.sh").read_text())
    assert command[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    job = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job",
                          *command[3:]], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    assert OmegaConf.create(job.stdout).data.train_files == config.data.train_files
    client, runs = mlflow_runs(default_run)
    (run,) = [r for r in runs if r.info.run_name == "preflight"]
    assert run.data.metrics["preflight.resolved_trainer_n_gpus_per_node"] == 8
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "train")}
    assert {"train/train_config_resolved.yaml", "train/train_command.sh",
            "train/preflight_report.json"} <= artifacts


def test_training_with_verl_on_a_cpu_stops_in_preflight(default_run) -> None:
    result = kedro_run(default_run, "--pipelines", "train", "--params", SMOLLM2, env=None)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "verl needs 8 CUDA GPU(s) per node" in output and "this machine has 0" in output
    assert "train.engine: trl" in output
    assert "ray init" not in output.lower()  # stopped before Ray
    assert "Completed node" not in output


def test_small_prompt_limit_drops_exactly_the_overlong_rows(tmp_path, smollm2_tokenizer) -> None:
    from rl_pipeline.data.prompts import chat_messages

    project = make_project(tmp_path)
    result = kedro_run(project, "--pipelines", "data_prep",
                       "--params", f"{SMOLLM2},data.data_max_prompt_length=100", env=None)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((project / "data/08_reporting/data_prep_report.json").read_text())

    params = data_prep_params(project, env="local")
    for split, source in (("train", GSM8K_TRAIN), ("val", GSM8K_TEST)):
        questions = [json.loads(line)["question"] for line in source.read_text().splitlines()]
        independent = sum(
            len(smollm2_tokenizer.apply_chat_template(
                chat_messages(q, params), add_generation_prompt=True, tokenize=True,
            )["input_ids"]) > 100 for q in questions)
        assert 0 < independent < len(questions)
        assert report["dropped_by_split"][split]["overlong_prompt"] == independent
        assert report["rows_out"][split] == len(questions) - independent
    _, (run,) = mlflow_runs(project)
    assert run.data.metrics["data_prep.dropped.overlong_prompt"] == report["dropped"][
        "overlong_prompt"]


def test_truncation_error_fails_naming_rows_and_keeps_earlier_versions(tmp_path,
                                                                       tiny_model_dir) -> None:
    project = make_project(tmp_path)
    model = f"base_model={tiny_model_dir}"
    first = kedro_run(project, "--pipelines", "data_prep", "--params", model, env=None)
    assert first.returncode == 0, first.stderr[-3000:]
    before = sorted(glob.glob(str(project / "data/05_model_input/*/*/*.parquet")))
    assert len(before) == 2

    failed = kedro_run(project, "--pipelines", "data_prep", "--params",
                       f"{model},data.data_max_prompt_length=150,"
                       "data.data_filter_overlong_prompts=false,data.data_truncation=error",
                       env=None)
    assert failed.returncode != 0
    output = failed.stdout + failed.stderr
    assert "prompt(s) longer than data_max_prompt_length=150 tokens" in output
    assert re.search(r"train\.jsonl, line \d+ \(\d+ tokens\)", output)
    after = sorted(glob.glob(str(project / "data/05_model_input/*/*/*.parquet")))
    assert after == before  # nothing new that a later load could pick up
    assert len(latest(project, "train_prompts")) == 7473
    _, runs = mlflow_runs(project)
    assert [r.info.status for r in runs] == ["FINISHED", "FAILED"]
    error = runs[1].data.tags["error"]  # the failed run says why
    assert error.startswith("DataError: ") and "data_max_prompt_length=150" in error


def test_bad_parameter_stops_the_run_before_any_node(tmp_path) -> None:
    project = make_project(tmp_path)
    result = kedro_run(project, "--pipelines", "data_prep", "--params",
                       "data.data_truncation=sideways,data_prep.on_bad_record=ignore")
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    assert "data.data_truncation='sideways'" in output
    assert "data_prep.on_bad_record='ignore'" in output  # every problem, not just the first
    assert "Running node" not in output
    assert not list(project.glob("data/05_model_input/*"))


# The CPU run of `make run`, shortened: two training steps, short completions, four prompts.
SHORT = ("train.trl.max_steps=2,data.data_max_response_length=24,train.trl.save_steps=1,"
         "eval.max_prompts=4")


def test_default_cpu_run_trains_merges_evaluates_and_decides_in_five_mlflow_runs(
        tmp_path) -> None:
    project = make_project(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(project)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "conf", "pyproject.toml"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    # The forecast too: tests/projects.py turns it off in the other tests' projects.
    params = f"{SHORT},train.forecast=true"
    result = kedro_run(project, "--params", params)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The rollout table appended each step, eval's evidence read back: no download bars.
    assert "Downloading artifacts" not in result.stdout + result.stderr
    # Off a terminal: a logged line per training step, not transformers' bars and prints.
    for bar_or_print in ("Loading weights", "{'loss'", "| 2/2 ["):
        assert bar_or_print not in result.stdout + result.stderr, bar_or_print
    assert re.search(r"INFO rl_pipeline.engines.trl.callbacks: step 2/2: reward [\d.]+, ",
                     result.stdout)
    metrics = json.loads((project / "data/08_reporting/eval_metrics.json").read_text())
    assert list(metrics) == ["base", "trained"]
    for label in ("base", "trained"):
        for key in ("strict_accuracy", "flexible_accuracy", "mean_reward", "strict_pass_at_1",
                    "mean_response_tokens", "truncation_rate", "by_data_source",
                    "reward_errors"):
            assert key in metrics[label]
        assert metrics[label]["prompts"] == 4
        assert 0 < metrics[label]["mean_response_tokens"] <= 24
    report = (project / "data/08_reporting/eval_report.md").read_text()
    assert "| metric | base | trained | delta |" in report
    merged = Path(ModelFolderDataset(path=str(project / "data/06_models/merged_model"),
                                     version=Version(None, None)).load())
    assert (merged / "model.safetensors").is_file()
    merge_metadata = json.loads((merged / "merge_metadata.json").read_text())
    assert merge_metadata["training_run"]["steps"] == 2
    assert merge_metadata["training_run"]["engine"] == "trl"

    # One MLflow run per stage, in order, each with its own parameters, metrics and reports.
    client, runs = mlflow_runs(project)
    assert [r.info.run_name for r in runs] == ["data_prep", "train", "merge", "eval",
                                               "promote"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    # Lineage: one execution, the commit, and each dataset version from save to load.
    assert len({r.data.tags["pipeline_execution_id"] for r in runs}) == 1
    assert len({r.data.tags["run_id"] for r in runs}) == 5  # Kedro's run (session) id
    # The command typed, on every stage's run; the same for that stage alone beside it, and
    # as the trl engine's launch (it has no launcher but the train stage).
    assert {r.data.tags["kedro_command"] for r in runs} == {
        shlex.join(["kedro", "run", "--env", "cpu", "--params", params])}
    stages = ("data_prep", "train", "merge", "eval", "promote")
    assert [r.data.tags["stage_command"] for r in runs] == [
        shlex.join(["kedro", "run", "--env", "cpu", "--params", params, "--pipelines", stage])
        for stage in stages]
    assert run_tags(runs, "train")["stage_command"] in \
        (project / "data/08_reporting/train_command.sh").read_text().splitlines()
    assert {(r.data.tags["git_commit"], r.data.tags["git_dirty"]) for r in runs} == \
        {(commit, "false")}
    saved = run_tags(runs, "data_prep")["dataset.saved.train_prompts"]
    assert saved == run_tags(runs, "train")["dataset.loaded.train_prompts"]
    assert run_tags(runs, "train")["train.engine"] == "trl"
    assert run_tags(runs, "merge")["source.train_run_id"] == runs[1].info.run_id
    assert run_tags(runs, "merge")["source.train_prompts_version"] == saved
    assert run_tags(runs, "eval")["dataset.loaded.merged_model"] == \
        run_tags(runs, "merge")["dataset.saved.merged_model"]
    # Versioned datasets only: a report the catalog does not version has no version tag.
    assert "dataset.saved.data_prep_report" not in run_tags(runs, "data_prep")
    prep, train, merge, evaluation, promotion = runs
    assert prep.data.metrics["data_prep.rows_out.val"] == 200  # conf/cpu's held-out additions
    assert prep.data.metrics["data_prep.reward_self_test.rl_pipeline/arithmetic.gold_correct"] \
        == 1.0
    assert "eval.max_prompts" not in prep.data.params
    assert train.data.params["train.engine"] == "trl"
    # Typed groups are logged field by field (defaults included), not as one long string.
    assert "train" not in train.data.params and "train" not in train.data.tags
    assert train.data.params["train.trl.beta"] == "0.0"
    assert not [k for k in train.data.params if k.startswith("train.verl.")]  # not its engine
    # Followers reach the nodes resolved, once, from their owners (SHORT's response cap).
    assert train.data.params["train.trl.max_completion_length"] == "24"
    assert evaluation.data.params["eval.max_new_tokens"] == "24"
    assert train.data.params["reward.custom_reward_function.name"] == "compute_score"
    assert prep.data.params["data_prep.data_source"] == "rl_pipeline/arithmetic"
    steps = client.get_metric_history(train.info.run_id, "train/reward")
    assert [m.step for m in steps] == [1, 2]
    # What the model wrote at each step: train.rollouts_logged_per_step rows of each step in
    # the run's table, eval's degeneration rates over all 8 rollouts of each step, and TRL's
    # own timing of its phases.
    table = json.loads(Path(client.download_artifacts(train.info.run_id, TABLE, str(tmp_path)))
                       .read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert sorted(r["step"] for r in rows) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert {"prompt", "response", "reward", "reward_function", "reward_timeout",
            "truncated"} <= set(table["columns"])
    assert all(r["prompt"].startswith("What is") for r in rows)
    for key in ("truncation_rate", "repetition_rate", "no_reasoning_rate", "count",
                "reward_error/mean", "reward_timeout/mean", "reward/mean", "reward/std",
                "reward/min", "reward/max"):
        assert [m.step for m in client.get_metric_history(
            train.info.run_id, f"{PREFIX}{key}")] == [1, 2], key
    # Under the names the verl engine logs them by (not train/rollouts/...), and the reward
    # curve both engines share is TRL's own reward.
    assert not [k for k in train.data.metrics if k.startswith(f"train/{PREFIX}")]
    assert [m.value for m in client.get_metric_history(train.info.run_id,
                                                       f"{PREFIX}reward/mean")] == \
        pytest.approx([m.value for m in client.get_metric_history(train.info.run_id,
                                                                  "train/reward")])
    # Every completion of a step is counted: conf/cpu's batch, 3 prompts x 4.
    batch = int(train.data.params["train.trl.per_device_train_batch_size"])
    assert batch == 12
    assert {m.value for m in client.get_metric_history(
        train.info.run_id, f"{PREFIX}count")} == {float(batch)}
    assert any(k.startswith("profiling/Time taken: GRPOTrainer.transformers.generate")
               for k in train.data.metrics)
    # The preflight's forecast (a calibration on this machine) against the run: the first
    # step in the log and as a metric, the whole training time beside its forecast.
    for key in ("preflight.forecast/step_s", "preflight.forecast/train_s",
                "preflight.forecast/eval_s", "preflight.forecast/peak_memory_gib",
                "preflight.forecast/disk_gib", "train.forecast/train_s", "train.actual/train_s",
                "train.forecast/train_ratio"):
        assert train.data.metrics[key] > 0, key
    assert [m.step for m in client.get_metric_history(train.info.run_id,
                                                      FIRST_STEP_METRIC)] == [1]
    assert re.search(r"step 1 took [\d.]+ s, forecast [\d.]+ s", result.stdout + result.stderr)
    assert "train/reward_curve.png" in {a.path for a in client.list_artifacts(
        train.info.run_id, "train")}
    assert merge.data.metrics["merge.max_abs_diff"] <= merge.data.metrics["merge.tolerance"]
    assert evaluation.data.metrics["trained/strict_accuracy"] == \
        metrics["trained"]["strict_accuracy"]
    assert evaluation.data.params["eval.max_prompts"] == "4"
    artifacts = {a.path for a in client.list_artifacts(evaluation.info.run_id, "eval")}
    assert artifacts == {"eval/eval_metrics.json", "eval/eval_report.md", "eval/eval_chart.png",
                         "eval/eval_generations.json", "eval/eval_registry.json"}
    # The verdict: first in the report, and a tag of the eval run.
    verdict = metrics["trained"]["verdict"]["verdict"]
    assert verdict in (LEARNED, HACKING, WORSE, NO_CHANGE)
    assert report.splitlines()[2].startswith(f"**Verdict: {verdict}.**")
    assert run_tags(runs, "eval")["eval.verdict"] == verdict
    assert "SmolLM2-135M-Instruct" in run_tags(runs, "eval")["eval.base_model"]
    assert run_tags(runs, "eval")["eval.verdict.rl_pipeline/arithmetic"] == verdict
    # Off a terminal the log is one line per record (rich wrapped it at 80 columns): the
    # verdict with all its reasons is one line a reader can grep.
    said = f"eval verdict: {verdict} ({run_tags(runs, 'eval')['eval.verdict_reasons']})"
    assert any(line.endswith(f"INFO rl_pipeline.pipelines.eval.nodes: {said}")
               for line in result.stdout.splitlines()), result.stdout[-3000:]
    # The README's example reads the generations table and the verdict, as written.
    example = subprocess.run([sys.executable, "-c", readme_block("mlflow.load_table")],
                             cwd=project, capture_output=True, text=True, timeout=120)
    assert example.returncode == 0, example.stderr[-2000:]
    assert example.stdout.splitlines()[0] == verdict and "What is" in example.stdout

    # The train stage again, unchanged: the same identity, complete, so nothing is trained;
    # its run says so and names the run whose weights it re-exports.
    rerun = kedro_run(project, "--pipelines", "train", "--params", SHORT)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    _, runs = mlflow_runs(project)
    first, again = [r.data.tags for r in runs if r.info.run_name == "train"]
    identity = first["train.identity"]
    assert len(identity) == 64 and again["train.identity"] == identity
    assert (first["train.resumed"], first["train.already_complete"]) == ("false", "false")
    assert first["train.weights_run_id"] == train.info.run_id
    assert (again["train.resumed"], again["train.already_complete"]) == ("true", "true")
    assert again["train.resumed_from_run"] == train.info.run_id
    assert (again["train.resumed_from_step"], again["train.weights_run_id"]) == \
        ("2", train.info.run_id)
    for stage in ("merge", "eval"):  # the weights they used, and their identity
        assert run_tags(runs, stage)["source.train_run_id"] == train.info.run_id
        assert run_tags(runs, stage)["source.train_identity"] == identity

    # The registry: the merged model is version 1 with its lineage, eval made it the
    # candidate, and the gate decided against the base model, with its reasons.
    (version,) = client.search_model_versions("name='rl_pipeline'")
    # Relative to the project, so that it holds where the project lies elsewhere.
    assert version.tags["catalog.path"] == merged.relative_to(project).as_posix()
    assert version.tags["merge_run_id"] == merge.info.run_id
    assert version.tags["train_run_id"] == train.info.run_id
    assert version.tags["train_prompts_version"] == saved
    assert version.tags["eval.run_id"] == evaluation.info.run_id
    assert version.tags["eval.verdict"] == verdict and version.tags["eval.reference"] == "base"
    assert str(client.get_model_version_by_alias("rl_pipeline", "candidate").version) == "1"
    decision = json.loads((project / "data/08_reporting/promotion_decision.json").read_text())
    assert decision["reference"] == "base" and decision["changed"]
    assert promotion.data.tags["promote.promoted"] == str(decision["promoted"]).lower()
    # Lineage both ways: the eval run names the version it recorded, the version the promote
    # run that decided on it.
    assert run_tags(runs, "eval")["eval.candidate_version"] == "1"
    assert run_tags(runs, "eval")["eval.quick_check"] == "true"
    assert client.get_model_version("rl_pipeline", "1").tags["promote.run_id"] == \
        promotion.info.run_id
    assert promotion.data.tags["promote.reasons"].startswith("mean_reward: ")
    # Eval answered 4 prompts (SHORT): a quick check, which the gate does not promote on.
    assert not decision["promoted"]
    assert promotion.data.tags["promote.reasons"].endswith(
        "eval answered 4 of the 200 validation prompts (eval.max_prompts, a quick check): no "
        "evidence for the gate; run eval with eval.max_prompts unset (null)")
    champion = client.get_registered_model("rl_pipeline").aliases.get("champion")
    assert (None if champion is None else str(champion)) == ("1" if decision["promoted"]
                                                              else None)
    card = (merged / "README.md").read_text()  # written once, at merge
    assert f"- train_prompts: version `{saved}`, 600 rows" in card  # conf/cpu's additions
    assert "never rewritten after merge" in card and "model-index" not in card
    check_manifest(merged)  # eval and promote left the folder as merge verified it
    assert not list(merged.glob(".*"))
