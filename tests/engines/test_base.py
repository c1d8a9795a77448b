"""The engine interface: the train nodes reach any engine through ENGINES, never by name."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest
from kedro.runner import SequentialRunner

from rl_pipeline.engines.base import (
    BAND_MAX,
    BAND_MIN,
    BAND_STD,
    Engine,
    Preflight,
    TrainRun,
    reward_curve,
)
from rl_pipeline.engines.lookup import choose_engine, get_engine
from rl_pipeline.params.train import ENGINES, TrainParams
from rl_pipeline.pipelines.train import create_pipeline
from rl_pipeline.training_result import TrainingResult
from tests.conftest import train_catalog


class CopyEngine(Engine):
    """A third engine in its own module: it 'trains' by copying the base model once per
    prompt row into a checkpoint folder, and exports the newest one."""

    name = "copy"

    def preflight(self, setup, *, training):
        return Preflight(plan={"engine": self.name, "rows": setup.train_rows},
                         report={"checked": training}, config_yaml="copy: true\n",
                         command="# no launcher\n", metrics={"copies": 1.0})

    def train(self, plan, setup, train_prompts, val_prompts, run_id):
        checkpoint = Path(setup.checkpoints_dir) / f"copy-{plan['rows']}"
        shutil.copytree(setup.base_model, checkpoint)
        return TrainRun(summary={"engine": self.name, "steps": plan["rows"], "seconds": 0.0,
                                 "resumed_from_step": 0},
                        history=[{"step": 1, "reward": 0.5}], checkpoints=checkpoint)

    def export(self, run, scratch_dir):
        out = Path(scratch_dir) / "exported"
        shutil.copytree(run.checkpoints, out)
        TrainingResult(kind="hf_model", engine=self.name, run=run.summary).write(out)
        return out


@pytest.fixture
def copy_engine(monkeypatch):
    module = types.ModuleType("copy_engine_for_tests")
    module.CopyEngine = CopyEngine
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(ENGINES, "copy", f"{module.__name__}:CopyEngine")


def test_a_third_engine_is_one_module_and_one_registry_line(copy_engine, tiny_model_dir,
                                                            tmp_path) -> None:
    catalog = train_catalog(tiny_model_dir, tmp_path, {"engine": "copy"}, rows=6)
    outputs = SequentialRunner().run(create_pipeline(), catalog)

    report = catalog["preflight_report"].load()
    assert report["engine"] == "copy" and report["checked"] is True
    assert outputs["train_run_tags"].load()["train.engine"] == "copy"
    assert report["train_prompts"] == 6
    assert outputs["preflight_metrics"].load()["copies"] == {"value": 1.0, "step": 0}
    exported = Path(outputs["training_result"].load())
    assert exported == tmp_path / "models" / "exported"
    assert (exported / "config.json").is_file()
    assert TrainingResult.read(exported).run["steps"] == 6
    assert outputs["train_metrics"].load()["steps"]["value"] == 6.0
    assert "copy engine" in outputs["reward_curve"].load().axes[0].get_title()


def test_an_unregistered_engine_is_refused_naming_the_registered_ones() -> None:
    from rl_pipeline.params import ConfigError

    with pytest.raises(ConfigError, match=r"train.engine='tlr': .*one of verl, trl, auto"):
        TrainParams.model_validate({"engine": "tlr"})


def test_every_registered_engine_implements_the_interface() -> None:
    for name in ENGINES:
        engine = get_engine(name)
        assert isinstance(engine, Engine) and engine.name == name


@pytest.mark.parametrize(("engine", "gpus", "expected"), [
    ("trl", 8, "trl"), ("verl", 0, "verl"), ("auto", 0, "trl"), ("auto", 1, None)])
def test_engine_choice(engine, gpus, expected) -> None:
    import importlib.util

    chosen, why = choose_engine(engine, gpus)
    if expected is None:  # auto with a GPU: verl only where vLLM is installed
        expected = "verl" if importlib.util.find_spec("vllm") else "trl"
    assert chosen == expected and engine in why


def _band(figure) -> tuple[float, float]:
    (band,) = figure.axes[0].collections
    ys = band.get_paths()[0].vertices[:, 1]
    return float(ys.min()), float(ys.max())


def test_the_reward_curves_band_stays_within_the_rewards_each_step_reached() -> None:
    """A 0/1 reward right 9 times in 10: mean 0.9, std 0.3; mean + std would be 1.2."""
    step = {"step": 1, "reward": 0.9, "reward_std": 0.3}
    band = {BAND_STD: 0.3, BAND_MIN: 0.0, BAND_MAX: 1.0}
    assert _band(reward_curve([{**step, **band}, {**step, **band, "step": 2}], "trl")) == \
        pytest.approx((0.6, 1.0))
    # A history without our band (a run logged before it): TRL's reward_std, as logged.
    assert _band(reward_curve([step, {**step, "step": 2}], "trl")) == pytest.approx((0.6, 1.2))
