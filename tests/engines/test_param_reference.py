"""The generated parameter reference (docs/parameters.md) against the code and the specs'
parameters (docs/reference/spec_parameters.yaml); the tools that make both."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from rl_pipeline.engines.verl.config import (
    NOT_VERL_KEYS,
    LaunchInputs,
    compose_verl_config,
    launch_overrides,
    override_key,
    owned_keys,
    spec_values,
)
from rl_pipeline.params import DataParams, RewardParams
from rl_pipeline.params.trl import TrlParams
from rl_pipeline.params.verl import VerlParams
from tests.conftest import PROJECT_ROOT
from tests.engines.spec_facts import (
    SPEC_PARAMETERS,
    load_script,
    reference,
    same_default,
    spec_defaults,
)

# The generator's own tables (scripts/parameter_reference.py).
CATALOG_INPUTS = reference.CATALOG_INPUTS
DATA_PREP_USES = reference.DATA_PREP_USES
EQUIVALENTS = reference.EQUIVALENTS
REGENERATE = reference.REGENERATE
SPECS = reference.SPECS
TRAIN_SETS = reference.TRAIN_SETS
VERL_NOT_KEYS = reference.VERL_NOT_KEYS
reference_markdown = reference.reference_markdown

DOC = PROJECT_ROOT / "docs" / "parameters.md"
COMPONENTS = {"verl_trainer_component": "verl_trainer_component.md",
              "rft_trainer": "rft_trainer_component.md",
              "group_relative_policy_optimization": "grpo_trl_component.md"}
# The spec types, and the Python types of their defaults.
TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
         "uri_file": str, "uri_folder": str}
_CELL = re.compile(r"(?<!\\)\|")
_MISSING = object()


def _launch(**inputs: str) -> list[str]:
    paths = LaunchInputs(train_files="/d/train.parquet", val_files="/d/val.parquet",
                         model_path="/m", checkpoints_dir="/c", **inputs)
    return launch_overrides(spec_values(VerlParams(), DataParams()), paths, RewardParams(),
                            critic=False, pip=[])


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


def test_the_script_prints_the_reference_from_anywhere(markdown, tmp_path) -> None:
    out = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts/parameter_reference.py")],
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout == markdown


def test_the_package_does_not_carry_the_generator() -> None:
    assert importlib.util.find_spec("rl_pipeline.engines.reference") is None


def test_the_spec_parameters_file_is_well_formed() -> None:
    components = yaml.safe_load(SPEC_PARAMETERS.read_text(encoding="utf-8"))["components"]
    assert {c["component"]: c["file"] for c in components} == COMPONENTS
    assert [(s.name, s.file) for s in SPECS] == [(c["component"], c["file"]) for c in components]
    for comp in components:
        names = [p["name"] for p in comp["parameters"]]
        assert len(names) == len(set(names)), comp["component"]
        for p in comp["parameters"]:
            where = f"{comp['component']}.{p['name']}"
            assert set(p) <= {"name", "type", "default", "enum"} and "default" in p, where
            assert p["type"] in TYPES, where
            default = p["default"]
            if default is not None:
                assert isinstance(default, TYPES[p["type"]]), where
                assert p["type"] == "boolean" or not isinstance(default, bool), where
            if "enum" in p:
                assert p["enum"] and all(isinstance(v, str) for v in p["enum"]), where
                assert default is None or default in p["enum"], where
    counts = {c["component"]: len(c["parameters"]) for c in components}
    assert counts == {"verl_trainer_component": 48, "rft_trainer": 51,
                      "group_relative_policy_optimization": 35}
    assert spec_defaults("group_relative_policy_optimization")["dataset_name"] == ""


def test_every_spec_parameter_has_a_home() -> None:
    catalog = yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text())
    for spec in SPECS:
        for name in spec_defaults(spec.name):
            where, ours = reference._home(spec, name, catalog)  # LookupError: no home
            assert where and ours, f"{spec.name}.{name}"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_spec_parameter_is_a_row_with_the_spec_default(markdown, spec) -> None:
    rows = _section(markdown, spec.name)
    facts = spec_defaults(spec.name)
    assert [r[0] for r in rows] == [f"`{name}`" for name in facts], "spec order, every name"
    for row, (name, default) in zip(rows, facts.items(), strict=True):
        cell = row[1].strip("`")  # the text, '-' for none, '' quoted
        assert same_default(default, {"-": None, "''": ""}.get(cell, cell)), name
        assert all(row[2:6]), f"{name}: an empty cell"


def test_every_equivalent_names_existing_parameters() -> None:
    grpo = set(spec_defaults("group_relative_policy_optimization"))
    verl = set(spec_defaults("verl_trainer_component")) | set(spec_defaults("rft_trainer"))
    config = compose_verl_config([])
    owned = owned_keys(_launch())
    for eq in EQUIVALENTS:
        assert eq.trl in grpo or eq.trl in TrlParams.model_fields, eq
        assert bool(eq.verl) != bool(eq.verl_keys), f"a spec parameter or keys: {eq}"
        if eq.verl:  # a spec parameter, or one of ours (as on the trl side)
            assert eq.verl in verl or eq.verl in VerlParams.model_fields, eq
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
    ray = re.search(r"`([\w.]+)`", TRAIN_SETS["ray_address"])[1]
    assert ray in {override_key(o) for o in _launch(ray_address="auto")}


def _data_prep_outcome(records_file, tokenizer_dir, **data) -> object:
    """What data_prep's nodes make of the records under these ``data`` settings: the prompts
    and the length summary, or the error."""
    from rl_pipeline.data.prompts import DataError
    from rl_pipeline.data.records import read_jsonl
    from rl_pipeline.params import DataPrepParams
    from rl_pipeline.pipelines.data_prep.nodes import clean_prompt_splits, fit_prompt_lengths

    prep = DataPrepParams(dataset_prompt_column="question", answer_column="answer")
    shared = DataParams(**data)
    try:
        train, val, hygiene = clean_prompt_splits(read_jsonl(records_file), None, prep, shared)
        train, val, lengths = fit_prompt_lengths(train, val, hygiene, str(tokenizer_dir), prep,
                                                 shared)
    except DataError as exc:
        return f"DataError: {str(exc).splitlines()[0]}"
    return (sorted(train.columns), [p[-1]["content"] for p in train["prompt"]], len(val),
            {s: (lengths[s]["truncated"], lengths[s]["dropped"]) for s in ("train", "val")})


def test_the_data_settings_the_reference_gives_data_prep_change_its_output(
        tokenizer_dir, tmp_path) -> None:
    """The reference says data_prep applies DATA_PREP_USES of the ``data`` group: each one,
    changed where it bites, changes what data_prep makes; the response cap does not."""
    from tests.conftest import read_gsm8k, write_jsonl

    records = write_jsonl(tmp_path / "raw.jsonl",
                          [{**r, "pics": ["a.png"]} for r in read_gsm8k(n=40)])
    # A cap near the median prompt (about 144 tokens with the tiny tokenizer): it bites.
    base = {"data_max_prompt_length": 150, "data_filter_overlong_prompts": False,
            "data_truncation": "left", "data_image_key": "images"}
    changed = {"data_max_prompt_length": 4096, "data_filter_overlong_prompts": True,
               "data_truncation": "right", "data_image_key": "pics"}
    assert set(changed) == DATA_PREP_USES
    before = _data_prep_outcome(records, tokenizer_dir, **base)
    assert not isinstance(before, str), before
    for name, value in changed.items():
        after = _data_prep_outcome(records, tokenizer_dir, **{**base, name: value})
        assert after != before, name
    same = _data_prep_outcome(records, tokenizer_dir, **base, data_max_response_length=7)
    assert same == before


def test_cells_escape_pipes() -> None:
    assert reference._row(["a|b", "c"]) == "| a\\|b | c |"


@pytest.mark.parametrize(("default", "ours", "same"), [
    (None, None, True), (None, 0, False), ("true", True, True), (True, True, True),
    (False, "false", True), (True, 1, False), (3e-06, 3e-06, True), (0, 0.0, True),
    (5, 5.0, True), (-1, None, False), ("", "", True), ("", None, False),
    ("all-linear", "all-linear", True), ("fsdp2", "fsdp", False), ("no", False, False)])
def test_same_default(default, ours, same) -> None:
    assert same_default(default, ours) is same


SPEC_MARKDOWN = """\
## A Component

### Name

my_component

## Inputs

### Some Parameters

| Name        | Description             | Type    | Default | Optional | Enum               |
| ----------- | ----------------------- | ------- | ------- | -------- | ------------------ |
| path_in     | A path                  | uri_file | -      | False    | NA                 |
| rate        | A rate                  | number  | 3e-6    | True     | NA                 |
| steps       | Steps, as a number      | number  | 5       | True     | NA                 |
| top_k       | Top-k (-1: off)         | integer | -1      | True     | NA                 |
| flag        | A flag                  | boolean | true    | True     | NA                 |
| mode        | A mode: 'no' or 'yes'   | string  | no      | True     | ['no', 'yes']      |
| as_text     | A boolean as a string   | string  | true    | True     | ['true', 'false']  |
| hub_name    | Empty by default        | string  | ''      | True     | NA                 |

## Outputs

| Name   | Description | Type       |
| ------ | ----------- | ---------- |
| out    | A folder    | uri_folder |
"""


def test_the_extractor_reads_a_spec_table_into_typed_facts(tmp_path) -> None:
    extractor = load_script(PROJECT_ROOT / "scripts/extract_spec_parameters.py")
    (tmp_path / "my.md").write_text(SPEC_MARKDOWN)
    (comp,) = extractor.extract(tmp_path, ("my.md",))
    assert (comp["component"], comp["file"]) == ("my_component", "my.md")
    assert comp["parameters"] == [
        {"name": "path_in", "type": "uri_file", "default": None},
        {"name": "rate", "type": "number", "default": 3e-06},
        {"name": "steps", "type": "number", "default": 5},
        {"name": "top_k", "type": "integer", "default": -1},
        {"name": "flag", "type": "boolean", "default": True},
        {"name": "mode", "type": "string", "default": "no", "enum": ["no", "yes"]},
        {"name": "as_text", "type": "string", "default": "true", "enum": ["true", "false"]},
        {"name": "hub_name", "type": "string", "default": ""}]
    text = extractor.to_yaml([comp])
    assert yaml.safe_load(text) == {"components": [comp]}
    assert text.startswith("# ") and "default: 'no'" in text
