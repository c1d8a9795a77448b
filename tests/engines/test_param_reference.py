"""The generated parameter reference (docs/parameters.md) against the code and the specs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from rl_pipeline.config import DataParams, RewardParams
from rl_pipeline.engines import reference
from rl_pipeline.engines.reference import (
    CATALOG_INPUTS,
    DATA_PREP_USES,
    EQUIVALENTS,
    REGENERATE,
    SPECS,
    TRAIN_SETS,
    VERL_NOT_KEYS,
    reference_markdown,
)
from rl_pipeline.engines.trl_params import TrlParams
from rl_pipeline.engines.verl_config import (
    NOT_VERL_KEYS,
    LaunchInputs,
    compose_verl_config,
    launch_overrides,
    override_key,
    owned_keys,
)
from rl_pipeline.engines.verl_params import VerlParams
from tests.conftest import PROJECT_ROOT
from tests.engines.spec_tables import spec_defaults

DOC = PROJECT_ROOT / "docs" / "parameters.md"
SPEC_FILES = {"verl_trainer_component.md", "rft_trainer_component.md", "grpo_trl_component.md"}
_CELL = re.compile(r"(?<!\\)\|")
_MISSING = object()


def _launch(**inputs: str) -> list[str]:
    paths = LaunchInputs(train_files="/d/train.parquet", val_files="/d/val.parquet",
                         model_path="/m", checkpoints_dir="/c", **inputs)
    return launch_overrides({}, paths, RewardParams(), critic=False, pip=[])


def _section(markdown: str, title: str) -> list[list[str]]:
    """The table rows (cells, unescaped) under ``## title``."""
    lines = markdown.splitlines()
    start = lines.index(f"## {title}")
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip().replace("\\|", "|") for c in _CELL.split(line.strip())[1:-1]]
            rows.append(cells)
    return rows[1:]  # without the header


@pytest.fixture(scope="module")
def markdown() -> str:
    return reference_markdown()


def test_committed_doc_is_current(markdown) -> None:
    assert DOC.read_text(encoding="utf-8") == markdown, (
        f"docs/parameters.md is stale: regenerate it with `{REGENERATE}`")


def test_module_main_prints_the_reference(markdown) -> None:
    out = subprocess.run([sys.executable, "-m", "rl_pipeline.engines.reference"],
                         capture_output=True, text=True, check=True, cwd=PROJECT_ROOT)
    assert out.stdout == markdown


def test_specs_table_is_the_specs_own() -> None:
    assert {spec.file for spec in SPECS} == SPEC_FILES
    for spec in SPECS:
        assert list(spec.params) == list(spec_defaults(spec.file).items()), spec.file


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_spec_parameter_is_a_row_with_the_spec_default(markdown, spec) -> None:
    rows = _section(markdown, spec.name)
    parsed = spec_defaults(spec.file)
    assert [r[0] for r in rows] == [f"`{name}`" for name in parsed], "spec order, every name"
    for row, (name, default) in zip(rows, parsed.items(), strict=True):
        assert row[1] == f"`{default}`", name
        assert all(row[2:6]), f"{name}: an empty cell"


def test_every_equivalent_names_existing_parameters() -> None:
    grpo = set(spec_defaults("grpo_trl_component.md"))
    verl = set(spec_defaults("verl_trainer_component.md")) | \
        set(spec_defaults("rft_trainer_component.md"))
    config = compose_verl_config([])
    owned = owned_keys(_launch())
    for eq in EQUIVALENTS:
        assert eq.trl in grpo or eq.trl in TrlParams.model_fields, eq
        assert bool(eq.verl) != bool(eq.verl_keys), f"a spec parameter or keys: {eq}"
        if eq.verl:
            assert eq.verl in verl, eq
            assert eq.verl in VerlParams.model_fields or eq.verl in DataParams.model_fields \
                or eq.verl in CATALOG_INPUTS, eq
        for key in eq.verl_keys:
            assert OmegaConf.select(config, key, default=_MISSING) is not _MISSING, key
            assert key not in owned, f"{key}: train.verl.overrides refuses it ({owned[key]})"
    pairs = [(eq.trl, eq.verl, eq.verl_keys) for eq in EQUIVALENTS]
    assert len(pairs) == len(set(pairs)), "a pair listed twice"


def test_catalog_inputs_exist_in_the_catalog() -> None:
    catalog = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text())
    for name, entry in CATALOG_INPUTS.items():
        for e in entry.entries:
            assert entry.key in catalog[e], (name, e)
    # verl's keys for the catalog inputs are the ones launch sets.
    launched = {override_key(o) for o in _launch()}
    for name in ("data_train_files", "data_val_files", "actor_model_path"):
        key = re.match(r"`([\w.]+)`", CATALOG_INPUTS[name].verl)[1]
        assert key in launched, name


def test_hand_written_routes_match_the_code() -> None:
    assert set(VERL_NOT_KEYS) == set(NOT_VERL_KEYS)
    assert DATA_PREP_USES <= set(DataParams.model_fields)
    prep = (PROJECT_ROOT / "src/rl_pipeline/pipelines/data_prep/nodes.py").read_text()
    for name in DATA_PREP_USES:
        assert f"shared.{name}" in prep, name
    assert "shared.data_max_response_length" not in prep
    ray = re.search(r"`([\w.]+)`", TRAIN_SETS["ray_address"])[1]
    assert ray in {override_key(o) for o in _launch(ray_address="auto")}


def test_cells_escape_pipes() -> None:
    assert reference._row(["a|b", "c"]) == "| a\\|b | c |"
