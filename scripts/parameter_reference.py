"""The parameter reference, ``docs/parameters.md``, generated from the code so it cannot drift.

Documentation tooling, not part of the ``rl_pipeline`` package. Regenerate the reference with::

    python scripts/parameter_reference.py > docs/parameters.md

Sources: the three component specs' parameters (name, type, default, enum) as
``docs/reference/spec_parameters.yaml`` records them (made from the spec documents by
``scripts/extract_spec_parameters.py``), the parameter models (``VerlParams``,
``TrlParams``, ``DataParams``, ``DataPrepParams``, ``TrainParams``), the spec -> engine
tables (:data:`rl_pipeline.engines.verl.config.MAPPING`,
:data:`rl_pipeline.engines.trl.config.MAPPING`), ``conf/base/catalog.yml`` and
:data:`EQUIVALENTS`, the parameters of one engine that mean the same as one of the other's.
``tests/engines/test_param_reference.py`` checks all of it and that the committed
``docs/parameters.md`` is current.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rl_pipeline.engines.trl import config as trl_config
from rl_pipeline.engines.verl import config as verl_config
from rl_pipeline.params import (
    FOLLOWERS,
    PARAMETER_GROUPS,
    DataParams,
    DataPrepParams,
    ParamGroup,
)
from rl_pipeline.params.train import TrainParams
from rl_pipeline.params.trl import TrlParams
from rl_pipeline.params.verl import VerlParams

REPO = Path(__file__).resolve().parents[1]  # scripts/ -> the repository
SPEC_PARAMETERS = REPO / "docs" / "reference" / "spec_parameters.yaml"
CATALOG_FILE = REPO / "conf" / "base" / "catalog.yml"
REGENERATE = "python scripts/parameter_reference.py > docs/parameters.md"


@dataclass(frozen=True)
class SpecParameter:
    """One row of a spec's parameter tables: its type and default (None: the spec gives none)
    as the table gives them, and its allowed values (empty: the spec lists none)."""

    name: str
    type: str
    default: Any
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    """One component spec: its name, file (in the spec folder), engine, parameters (the
    spec's parameter tables, in order)."""

    name: str
    file: str
    engine: str
    params: tuple[SpecParameter, ...]

    def defaults(self) -> dict[str, Any]:
        """Parameter name -> the spec's default (None: none), in the spec's order."""
        return {p.name: p.default for p in self.params}


# The engine that trains with each component spec's parameters.
ENGINES = {"verl_trainer_component": "verl", "rft_trainer": "verl",
           "group_relative_policy_optimization": "trl"}


def load_specs(path: Path = SPEC_PARAMETERS) -> tuple[Spec, ...]:
    """The component specs, as ``docs/reference/spec_parameters.yaml`` records them."""
    components = yaml.safe_load(path.read_text(encoding="utf-8"))["components"]
    return tuple(
        Spec(c["component"], c["file"], ENGINES[c["component"]],
             tuple(SpecParameter(p["name"], p["type"], p["default"], tuple(p.get("enum", ())))
                   for p in c["parameters"]))
        for c in components)


def same_default(default: Any, value: Any) -> bool:
    """Whether ``value`` (ours) equals a spec's ``default`` (None: the spec gives none).

    The specs write booleans as strings at times (``apply_lora: 'true'``) and numbers of type
    ``number`` as integers (``logging_steps: 5``): those compare equal to ``True`` and ``5.0``.
    """
    if default is None:
        return value is None
    if isinstance(default, bool) or isinstance(value, bool):
        return str(default).lower() == str(value).lower()
    if isinstance(value, int | float):
        try:
            return float(default) == float(value)
        except (TypeError, ValueError):
            return False
    return str(default) == str(value)


SPECS: tuple[Spec, ...] = load_specs()


@dataclass(frozen=True)
class Equivalent:
    """A trl-engine parameter and the verl-engine setting that means the same.

    ``trl``: a grpo spec parameter or a ``train.trl`` field (ours). ``verl``: a
    verl_trainer_component / rft_trainer parameter, or "" when no spec parameter carries it
    and ``verl_keys`` (verl Hydra keys, set through ``train.verl.overrides``) do.
    """

    trl: str
    verl: str = ""
    verl_keys: tuple[str, ...] = ()
    note: str = ""


_ACTOR = "actor_rollout_ref.actor"
_STEPS = ("Units differ: a TRL step is one optimizer update; a verl step is one batch of "
          "data_train_batch_size prompts (ppo_epochs x data_train_batch_size / "
          "actor_ppo_mini_batch_size updates).")

EQUIVALENTS: tuple[Equivalent, ...] = (
    # Model and LoRA
    Equivalent("model_name_or_path", "actor_model_path",
               note="Both are the catalog entry base_model: one base model for both engines."),
    Equivalent("apply_lora", "actor_model_lora_rank",
               note="apply_lora false (train all weights) is verl's actor_model_lora_rank 0."),
    Equivalent("lora_rank", "actor_model_lora_rank",
               note="peft's r. Defaults differ: 16 (ours, trl) and 64 (the verl specs)."),
    Equivalent("lora_alpha", "actor_model_lora_alpha"),
    Equivalent("lora_target_modules", "actor_model_target_modules",
               note="Both become peft's target_modules."),
    Equivalent("lora_dropout", "actor_model_lora_dropout",
               note="verl's FSDP engine has no dropout setting: above 0 the verl run starts "
               "from an initial adapter with it (verl's lora_adapter_path). Defaults differ: "
               "0.05 (ours, trl) and 0 (verl's behaviour)."),
    # GRPO algorithm
    Equivalent("algorithm_adv_estimator", "algorithm_adv_estimator",
               note="The trl engine implements grpo and reinforce_plus_plus only."),
    Equivalent("beta", "actor_kl_loss_coef",
               note="TRL's beta is the KL coefficient in the loss (0 loads no reference model); "
               "verl applies actor_kl_loss_coef only with actor_use_kl_loss true, so beta 0 "
               "is actor_use_kl_loss false. TRL's KL estimator is k3, verl's low_var_kl (k3 "
               "clamped to [-10, 10])."),
    Equivalent("epsilon", "actor_clip_ratio",
               note="TRL clips the ratio to [1 - epsilon, 1 + epsilon] (epsilon_high unset). "
               "actor_clip_ratio sets verl's clip_ratio_low and clip_ratio_high, which its loss "
               "reads (actor.clip_ratio alone changes nothing)."),
    Equivalent("num_iterations", verl_keys=(f"{_ACTOR}.ppo_epochs",),
               note="Optimisation passes over each generated batch (mu); verl's default is 1."),
    Equivalent("num_generations", "rollout_n"),
    Equivalent("scale_rewards", verl_keys=("algorithm.norm_adv_by_std_in_grpo",),
               note="group is true (both defaults), none is false; batch has no verl "
               "counterpart for grpo."),
    Equivalent("loss_type", verl_keys=(f"{_ACTOR}.loss_agg_mode",),
               note="dapo ~ token-mean (verl's default), grpo ~ seq-mean-token-mean, dr_grpo ~ "
               "seq-mean-token-sum-norm; TRL's other loss types have no verl mode."),
    # Training
    Equivalent("num_train_epochs", "trainer_total_epochs",
               note="verl takes whole epochs; TRL accepts fractions."),
    Equivalent("max_steps", "total_training_steps",
               note="Both override the epochs; TRL's -1 is verl's null. " + _STEPS),
    Equivalent("per_device_train_batch_size", "actor_ppo_micro_batch_size_per_gpu",
               note="Completions per device per forward/backward. In TRL it also sizes the "
               "generation batch (processes x per_device_train_batch_size x "
               "gradient_accumulation_steps completions); in verl data_train_batch_size and "
               "actor_ppo_mini_batch_size (prompts) do, and the accumulation follows."),
    Equivalent("learning_rate", "actor_optim_lr"),
    Equivalent("warmup_ratio", "actor_optim_lr_warmup_steps_ratio",
               note="verl uses the ratio while optim.lr_warmup_steps <= 0 (its default, -1); "
               "verl's default ratio is 0."),
    Equivalent("lr_scheduler_type", "actor_optim_lr_scheduler_type",
               note="verl knows constant (its default) and cosine only."),
    Equivalent("max_grad_norm", verl_keys=(f"{_ACTOR}.optim.clip_grad",),
               note="verl's FSDP engine reads optim.clip_grad (actor.grad_clip is not read)."),
    Equivalent("optim", verl_keys=(f"{_ACTOR}.optim.optimizer",),
               note="verl names a class of optim.optimizer_impl (torch.optim): adamw_torch is "
               "AdamW, verl's default; TRL's other names have no direct verl value."),
    # Text generation
    Equivalent("max_prompt_length", "data_max_prompt_length",
               note="TRL 1.12 has no GRPOConfig.max_prompt_length: data_prep's filter and "
               "truncation at data.data_max_prompt_length cap the prompts of both engines. "
               "Set the two alike."),
    Equivalent("max_completion_length", "data_max_response_length"),
    Equivalent("temperature", "rollout_temperature"),
    Equivalent("top_p", "rollout_top_p"),
    # Evaluation, logging and saving
    Equivalent("eval_steps", "trainer_test_freq",
               note="TRL evaluates every eval_steps with eval_strategy steps; eval_strategy no "
               "is trainer_test_freq -1. " + _STEPS),
    Equivalent("save_steps", "trainer_save_freq",
               note="Both also save the last step; verl's -1 (never) is refused. " + _STEPS),
    Equivalent("save_total_limit", "trainer_max_actor_ckpt_to_keep",
               note="null keeps every checkpoint in both."),
    # Miscellaneous
    Equivalent("seed", "seed",
               note="verl's seeds the data order, the rollout's sampling and (on a CPU) the "
               "LoRA initialisation; TRL's every random draw of the trainer."),
    Equivalent("shuffle_dataset", verl_keys=("data.shuffle",)),
    Equivalent("use_liger_kernel", verl_keys=("actor_rollout_ref.model.use_liger",)),
    Equivalent("vllm_gpu_memory_utilization", "rollout_gpu_memory_utilization",
               note="TRL's applies with use_vllm only."),
    Equivalent("vllm_tensor_parallel_size", "rollout_tensor_model_parallel_size",
               note="TRL's applies with use_vllm only."),
)


@dataclass(frozen=True)
class CatalogInput:
    """A spec input that a catalog entry provides: the entries, the entry key that holds the
    path (or name), and what each engine does with it."""

    entries: tuple[str, ...]
    key: str
    verl: str
    trl: str


_PREP = "data_prep reads it; its prompts train both engines"
_PREP_VAL = "data_prep reads it; its prompts validate both engines"
_PREP_HF = "data_prep reads this Hugging Face dataset instead of the JSONL files"
_SHARED_PREP = "data_prep: it builds the prompts of both engines"
CATALOG_INPUTS: dict[str, CatalogInput] = {
    "data_train_files": CatalogInput(
        ("train_prompts",), "filepath",
        "`data.train_files`: the newest `train_prompts` file (`train_prompts_file`)",
        "trains on the same `train_prompts`"),
    "data_val_files": CatalogInput(
        ("val_prompts",), "filepath",
        "`data.val_files`: the newest `val_prompts` file (`val_prompts_file`)",
        "evaluates on the same `val_prompts` (with do_eval)"),
    "actor_model_path": CatalogInput(
        ("base_model",), "source", "`actor_rollout_ref.model.path`",
        "the policy model (as model_name_or_path)"),
    "model_name_or_path": CatalogInput(
        ("base_model",), "source", "`actor_rollout_ref.model.path` (as actor_model_path)",
        "the policy model"),
    "dataset_train_split": CatalogInput(("raw_train",), "filepath", _PREP, _PREP),
    "dataset_validation_split": CatalogInput(("raw_val",), "filepath", _PREP_VAL, _PREP_VAL),
    "dataset_name": CatalogInput(("raw_train", "raw_val"), "dataset_name", _PREP_HF, _PREP_HF),
}
# The shared `data` parameters that data_prep applies (to the prompts of both engines).
DATA_PREP_USES = frozenset({"data_max_prompt_length", "data_filter_overlong_prompts",
                            "data_truncation", "data_image_key"})
# verl spec parameters that are no verl key (verl_config.NOT_VERL_KEYS), and what they become.
VERL_NOT_KEYS: dict[str, str] = {
    "pypi_packages_override": "the Ray workers' `runtime_env` pip list",
}

# What the `train` group's own settings set.
TRAIN_SETS: dict[str, str] = {
    "ray_address": "verl: `ray_kwargs.ray_init.address`",
}

_HOMES: dict[str, tuple[tuple[str, type[ParamGroup]], ...]] = {
    "verl": (("train.verl", VerlParams), ("data", DataParams)),
    "trl": (("train.trl", TrlParams), ("data_prep", DataPrepParams)),
}
_RUNTIME = re.compile(r"\$\{runtime_params:(\w+),\s*(.*)\}")
_REF = re.compile(r"\$\{(\w+)\}")


def reference_markdown(catalog_file: Path = CATALOG_FILE,
                       specs: tuple[Spec, ...] = SPECS) -> str:
    """The parameter reference (``docs/parameters.md``) as Markdown."""
    catalog = yaml.safe_load(catalog_file.read_text(encoding="utf-8"))
    out = [
        "# Parameter reference",
        "",
        f"Generated from the code; do not edit. Regenerate with `{REGENERATE}` "
        "(`tests/engines/test_param_reference.py` fails while this file is stale).",
        "",
        "One section per component spec, one row per spec parameter in the spec's order:",
        "",
        "- **spec default**: as the spec's table writes it (`-`: none).",
        "- **set in**: where the parameter lives here: a parameter (`train.verl.*`, "
        "`train.trl.*`, the shared `data` group, `data_prep`) or a catalog entry "
        "(`conf/base/catalog.yml`; `--params NAME=...` of `kedro run` sets the runtime parameter "
        "named).",
        "- **our default**: the parameter model's default (the catalog's, for catalog "
        "entries); `conf/*/parameters*.yml` may set other values.",
        "- **verl** / **trl**: what the parameter sets in each engine: a verl Hydra key, a "
        "TRL `GRPOConfig` field, or how it gets there. `=` names the other engine's "
        "parameter that means the same ([equivalents](#equivalent-parameters)).",
        "",
    ]
    for spec in specs:
        out += _spec_section(spec, catalog)
    out += _equivalents_section()
    out += _followers_section()
    out += _ours_section()
    out += _groups_section()
    return "\n".join(out).rstrip("\n") + "\n"


# ---------------------------------------------------------------- sections


def _spec_section(spec: Spec, catalog: dict[str, Any]) -> list[str]:
    how = "" if spec.engine == "verl" else ", TRL's GRPOTrainer"
    lines = [f"## {spec.name}", "",
             f"Spec file `{spec.file}`; the {spec.engine} engine (`train.engine: "
             f"{spec.engine}`{how}) trains with these parameters.", "",
             "| parameter | spec default | set in | our default | verl | trl | notes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for param in spec.params:
        name, default = param.name, param.default
        where, ours = _home(spec, name, catalog)
        if spec.engine == "verl":
            verl, trl = _verl_own(name), _trl_for_verl(name)
        else:
            verl, trl = _verl_for_trl(name), _trl_own(name)
        cells = [f"`{name}`", _code(_spec_default(default)), where, ours, verl, trl,
                 _notes(spec, name, default)]
        lines.append(_row(cells))
    return [*lines, ""]


def _equivalents_section() -> list[str]:
    lines = ["## Equivalent parameters", "",
             "Parameters of the two engines that mean the same (`EQUIVALENTS` in "
             "`scripts/parameter_reference.py`). A verl setting that no spec parameter "
             "carries is set through `train.verl.overrides`.", "",
             "| trl (`train.trl`) | verl | note |", "| --- | --- | --- |"]
    grpo = _spec_names("trl")
    for eq in EQUIVALENTS:
        trl = f"`{eq.trl}`" + ("" if eq.trl in grpo else " (ours)")
        lines.append(_row([trl, _verl_side(eq), eq.note or "-"]))
    return [*lines, ""]


def _followers_section() -> list[str]:
    lines = ["## One owner per setting", "",
             "Where the specs give one setting several names, one parameter owns it and the "
             "others follow (`FOLLOWERS` in `src/rl_pipeline/params/base.py`): left null they "
             "take the owner's value, set to another value they are refused, naming both.", "",
             "| follower | owner |", "| --- | --- |"]
    lines += [_row([f"`{f.name}`", f"`{f.owner}`"]) for f in FOLLOWERS]
    return [*lines, ""]


def _ours_section() -> list[str]:
    lines = ["## Our own parameters", "",
             "Parameters of ours that no spec names (their descriptions come from the "
             "parameter models); the [other groups](#the-other-groups) follow.", "",
             "| parameter | default | description | sets | = |",
             "| --- | --- | --- | --- | --- |"]
    rows: list[tuple[str, str, Any, str, str]] = []
    for name, field in TrainParams.model_fields.items():
        if not _is_group(field.annotation):
            rows.append((f"train.{name}", name, field, TRAIN_SETS.get(name, "-"), ""))
    verl_spec = _spec_names("verl")
    for name, field in VerlParams.model_fields.items():
        if name not in verl_spec:
            rows.append((f"train.verl.{name}", name, field,
                         "more verl Hydra overrides" if name == "overrides" else "-", ""))
    trl_spec = _spec_names("trl")
    for name, field in TrlParams.model_fields.items():
        if name not in trl_spec:
            rows.append((f"train.trl.{name}", name, field, _trl_own(name),
                         ", ".join(_verl_side(eq) for eq in _equivalents(trl=name))))
    for where, _, field, sets, same in rows:
        description = (field.description or "").removeprefix("Ours. ")
        lines.append(_row([f"`{where}`", _code(_fmt(_default(field))), description, sets,
                           same or "-"]))
    return [*lines, ""]


# The groups with no spec parameters of their own, in the order a run meets them.
OTHER_GROUPS = ("data", "data_prep", "reward", "eval", "merge", "registry", "promote")


def _groups_section() -> list[str]:
    lines = ["## The other groups", "",
             "Every field of the other parameter groups (set one with `--params "
             "GROUP.FIELD=...`; a nested group's fields as `GROUP.NESTED.FIELD`). The fields "
             "that the spec sections above hold are left out here.", ""]
    for group in OTHER_GROUPS:
        model = PARAMETER_GROUPS[group]
        lines += [f"### `{group}`", "", (model.__doc__ or "").strip().splitlines()[0], "",
                  "| parameter | default | description |", "| --- | --- | --- |"]
        held = {_spec_home(spec, name) for spec in SPECS for name in spec.defaults()}
        for where, field in _fields(group, model):
            if where in held:
                continue
            lines.append(_row([f"`{where}`", _code(_fmt(_default(field))),
                               (field.description or "").removeprefix("Ours. ")]))
        lines.append("")
    return lines


def _fields(prefix: str, model: type[ParamGroup]) -> list[tuple[str, Any]]:
    """(dotted name, field) of every leaf field of ``model``, nested groups flattened."""
    rows: list[tuple[str, Any]] = []
    for name, field in model.model_fields.items():
        if _is_group(field.annotation):
            rows += _fields(f"{prefix}.{name}", field.annotation)
        else:
            rows.append((f"{prefix}.{name}", field))
    return rows


# ---------------------------------------------------------------- cells


def _home(spec: Spec, name: str, catalog: dict[str, Any]) -> tuple[str, str]:
    """Where a spec parameter lives here, and our default, as Markdown cells."""
    if name in CATALOG_INPUTS:
        entry = CATALOG_INPUTS[name]
        value, runtime = _catalog_value(catalog, entry.entries[0], entry.key)
        where = "catalog " + ", ".join(f"`{e}`" for e in entry.entries)
        if runtime:
            where += f" (`--params {runtime}=...`)"
        return where, _code(value)
    path = _spec_home(spec, name)
    if path:
        owner, field = _OWNERS.get(path), _field_at(path)
        return f"`{path}`", f"follows `{owner}`" if owner else _code(_fmt(_default(field)))
    raise LookupError(f"{spec.name} parameter {name!r} has no home: add it to a parameter "
                      "model or to CATALOG_INPUTS")


def _spec_home(spec: Spec, name: str) -> str | None:
    """The parameter path of spec parameter ``name`` (None: a catalog input)."""
    for prefix, model in _HOMES[spec.engine]:
        if name in model.model_fields:
            return f"{prefix}.{name}"
    return None


def _field_at(path: str) -> Any:
    group, *nested, name = path.split(".")
    model = PARAMETER_GROUPS[group]
    for part in nested:
        model = model.model_fields[part].annotation
    return model.model_fields[name]


def _verl_own(name: str) -> str:
    """The verl cell of a verl spec parameter."""
    if name in CATALOG_INPUTS:
        return CATALOG_INPUTS[name].verl
    if name in VERL_NOT_KEYS:
        return VERL_NOT_KEYS[name]
    m = _verl_mappings()[name]
    return (f"`{m.key}`" + (" (not in verl's schema: added)" if m.add else "")
            + (f"; {m.note}" if m.note else ""))


def _trl_for_verl(name: str) -> str:
    """The trl cell of a verl spec parameter."""
    if name in CATALOG_INPUTS:
        return CATALOG_INPUTS[name].trl
    same = ", ".join(f"= `{eq.trl}`" for eq in _equivalents(verl=name))
    if name in DATA_PREP_USES:
        return "data_prep applies it to the prompts of both engines" + \
            (f" ({same})" if same else "")
    return same or "verl only"


def _trl_own(name: str) -> str:
    """The trl cell of a grpo spec parameter or a ``train.trl`` field."""
    if name in CATALOG_INPUTS:
        return CATALOG_INPUTS[name].trl
    if _in_data_prep(name):
        return _SHARED_PREP
    m = {m.spec: m for m in trl_config.MAPPING}.get(name)
    if m is not None:
        return f"`GRPOConfig.{m.field}`" + (f" ({m.note})" if m.note else "")
    return trl_config.NOT_GRPO_KEYS[name]


def _verl_for_trl(name: str) -> str:
    """The verl cell of a grpo spec parameter."""
    if name in CATALOG_INPUTS:
        return CATALOG_INPUTS[name].verl
    if _in_data_prep(name):
        return _SHARED_PREP
    return ", ".join(_verl_side(eq) for eq in _equivalents(trl=name)) or "trl only"


def _verl_side(eq: Equivalent) -> str:
    if not eq.verl:
        return "`train.verl.overrides`: " + ", ".join(f"`{k}`" for k in eq.verl_keys)
    if eq.verl in CATALOG_INPUTS:
        return f"= `{eq.verl}`"
    home = "train.verl" if eq.verl in VerlParams.model_fields else "data"
    if eq.verl not in _verl_mappings():  # ours, set through another verl route (its note)
        return f"= `{home}.{eq.verl}`"
    return f"= `{home}.{eq.verl}` (`{_verl_mappings()[eq.verl].key}`)"


def _notes(spec: Spec, name: str, default: Any) -> str:
    notes = []
    if spec.engine == "verl" and name in _verl_mappings():
        key = _verl_mappings()[name].key
        aliases = [m.spec for m in verl_config.MAPPING if m.key == key and m.spec != name]
        notes += [f"the same verl key as `{a}`" for a in aliases]
    if name not in CATALOG_INPUTS:
        prefix, model = next((prefix, model) for prefix, model in _HOMES[spec.engine]
                             if name in model.model_fields)
        ours = _default(model.model_fields[name])
        if f"{prefix}.{name}" in _OWNERS:
            notes.append("one owner for one setting: null takes the owner's value, another "
                         "value is refused (`FOLLOWERS` in `src/rl_pipeline/params/base.py`)")
        elif not same_default(default, ours):
            notes.append(_why_different(spec, name, ours))
    return "; ".join(notes) or "-"


_OWNERS = {f.name: f.owner for f in FOLLOWERS}


def _why_different(spec: Spec, name: str, ours: Any) -> str:
    for other in SPECS:
        if other.engine == spec.engine and other is not spec:
            theirs = other.defaults()
            if name in theirs and same_default(theirs[name], ours):
                return f"our default is {other.name}'s (it wins where the specs differ)"
    return "our default differs from the spec's"


# ---------------------------------------------------------------- helpers


def _equivalents(*, trl: str = "", verl: str = "") -> list[Equivalent]:
    """The equivalents of a trl name, or of a verl name (or a name with the same verl key)."""
    if trl:
        return [eq for eq in EQUIVALENTS if eq.trl == trl]
    mappings = _verl_mappings()
    key = mappings[verl].key if verl in mappings else None
    return [eq for eq in EQUIVALENTS if eq.verl == verl or
            (key is not None and eq.verl in mappings and mappings[eq.verl].key == key)]


def _in_data_prep(name: str) -> bool:
    """Whether a grpo spec parameter lives in the ``data_prep`` group (not in ``train.trl``)."""
    return name in DataPrepParams.model_fields and name not in TrlParams.model_fields


def _verl_mappings() -> dict[str, verl_config.Mapping]:
    return {m.spec: m for m in verl_config.MAPPING}


def _spec_names(engine: str) -> set[str]:
    return {name for spec in SPECS if spec.engine == engine for name in spec.defaults()}


def _catalog_value(catalog: dict[str, Any], entry: str, key: str) -> tuple[str, str | None]:
    """A catalog entry's value (references and runtime-parameter defaults resolved), and the
    runtime parameter that sets it, if any."""
    value = str(catalog[entry][key])
    if ref := _REF.fullmatch(value):
        value = str(catalog[ref[1]])
    if runtime := _RUNTIME.fullmatch(value):
        default = runtime[2].strip()
        return ("''" if default in ('""', "''") else default), runtime[1]
    return value, None


def _default(field: Any) -> Any:
    return field.get_default(call_default_factory=True)


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, ParamGroup)


def _fmt(value: Any) -> str:
    """A value as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if value == "":
        return "''"
    return str(value)


def _spec_default(value: Any) -> str:
    """A spec default as YAML writes it, '-' where the spec gives none."""
    return "-" if value is None else _fmt(value)


def _code(text: str) -> str:
    return f"`{text}`"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the parameter reference "
                                     "(docs/parameters.md) to standard output.")
    parser.add_argument("--spec-parameters", type=Path, default=SPEC_PARAMETERS,
                        help="the specs' parameters (default: %(default)s)")
    parser.add_argument("--catalog", type=Path, default=CATALOG_FILE,
                        help="the Data Catalog (default: %(default)s)")
    args = parser.parse_args(argv)
    sys.stdout.write(reference_markdown(args.catalog, load_specs(args.spec_parameters)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
