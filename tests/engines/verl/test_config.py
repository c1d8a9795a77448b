"""The spec -> verl key table against the installed verl's own Hydra config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rl_pipeline.engines.verl.config import (
    MAPPING,
    NOT_VERL_KEYS,
    compose_verl_config,
    hydra_overrides,
    spec_values,
)
from rl_pipeline.params import DataParams
from rl_pipeline.params.verl import VerlParams
from tests.conftest import PROJECT_ROOT
from tests.engines.spec_facts import same_default as _same
from tests.engines.spec_facts import spec_defaults as _spec_defaults

# Inputs that come from the catalog, not from parameters.
FROM_CATALOG = {"data_train_files", "data_val_files", "actor_model_path"}
PATHS = ["data.train_files=/data/train.parquet", "data.val_files=/data/val.parquet",
         "actor_rollout_ref.model.path=/models/base"]


@pytest.fixture(scope="module")
def composed():
    values = spec_values(VerlParams(), DataParams())
    return values, compose_verl_config(hydra_overrides(values, PATHS))


def test_every_mapped_key_exists_in_verl_and_gets_its_value(composed) -> None:
    values, config = composed
    for m in MAPPING:
        got = OmegaConf.select(config, m.key, throw_on_missing=True)
        want = m.verl_value(values[m.spec])
        assert got == want, f"{m.spec} -> {m.key}: {got!r} != {want!r}"


def test_every_spec_parameter_is_ours_with_the_spec_default() -> None:
    verl = _spec_defaults("verl_trainer_component")
    rft = _spec_defaults("rft_trainer")
    defaults = {**verl, **rft}  # rft_trainer's default wins where they differ
    ours = spec_values(VerlParams(), DataParams())
    mapped = {m.spec for m in MAPPING} | set(NOT_VERL_KEYS)
    for name, default in defaults.items():
        if name in FROM_CATALOG:
            continue
        assert name in ours, f"spec parameter {name} is missing"
        assert name in mapped, f"spec parameter {name} is not mapped to verl"
        assert _same(default, ours[name]), f"{name}: spec default {default}, ours {ours[name]}"
    assert len(defaults) >= 55


def test_a_key_verl_does_not_have_fails_composition() -> None:
    with pytest.raises(Exception, match="actor_rollout_ref.rollout.no_such_key"):
        compose_verl_config([*PATHS, "actor_rollout_ref.rollout.no_such_key=1"])


@pytest.mark.slow
def test_verls_own_cli_accepts_the_overrides() -> None:
    overrides = hydra_overrides(spec_values(VerlParams(), DataParams()), PATHS)
    result = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job",
                             *overrides], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "adv_estimator: grpo" in result.stdout


def test_the_base_configuration_trains_with_the_spec_defaults() -> None:
    from kedro.config import OmegaConfigLoader

    from rl_pipeline.params import ConfigError
    from rl_pipeline.params.train import TrainParams

    params = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base",
                               default_run_env="base")["parameters"]
    train = TrainParams.model_validate(params["train"])
    assert train.engine == "verl" and train.verl == VerlParams()
    with pytest.raises(ConfigError, match="train.verl.algorithm_adv_estimator='ppo'"):
        TrainParams.model_validate({"verl": {"algorithm_adv_estimator": "ppo"}})


def test_a_value_reaches_verl_exactly_as_given() -> None:
    """Hydra keeps a backslash in a quoted string except before a quote: a regular
    expression in the reward group (its JSON) must arrive with one backslash, not two."""
    from rl_pipeline.engines.verl.config import compose_verl_config, reward_overrides
    from rl_pipeline.params import RewardParams

    tricky = " | ".join([r"C:\models\judge", "it's", "a,b=c", "quote after backslash \\'",
                         "ends in \\"])
    reward = RewardParams.model_validate({
        "custom_reward_function": {"name": "regex"},
        "regex": {"pattern": r"Label:\s*(?P<answer>\w+)", "example": "Label: {answer}"},
        "judge": {"rubric": tricky}})
    config = compose_verl_config(["data.max_response_length=64",
                                  *reward_overrides(reward, None)])
    sent = config.reward.custom_reward_function.reward_kwargs.reward
    assert RewardParams.model_validate_json(sent) == reward
    assert RewardParams.model_validate_json(sent).judge.rubric.endswith("\\")
    # A value that ends in a backslash, or has one before a quote, as Hydra's parser reads it.
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rl_pipeline.engines.verl.config import _hydra_value

    parser = OverridesParser.create()
    for text in ("ends in \\", "it's \\'quoted\\'", r"C:\models\judge"):
        assert parser.parse_override(f"key={_hydra_value(text)}").value() == text
