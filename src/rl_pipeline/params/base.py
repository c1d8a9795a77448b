"""The base of every parameter group, and the parameters that follow others.

Each group is a pydantic model whose fields carry their default and help text, so the model
is its own reference (in the manner of TRL's ``GRPOConfig``) and the one source of every
default: ``conf/*/parameters*.yml`` set only what a configuration changes, and
``docs/parameters.md`` is generated from the models. Nodes declare their groups by type
(``data: DataParams``); Kedro instantiates them from ``params:<group>`` before the run
starts, and :meth:`ParamGroup.model_validate` words every problem at once, naming the
parameter, the value given and what is allowed.

Where several parameters mean one thing (a spec name of each trainer for the response length,
say), :data:`FOLLOWERS` names one owner: the others default to null and then take the owner's
value; a follower set to a different value is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from rl_pipeline.errors import UserError


class ConfigError(UserError, ValueError):
    """One or more parameters are invalid. The message lists each of them."""


@dataclass(frozen=True)
class Follower:
    """A parameter that means the same as its ``owner`` (both as ``group.name`` paths)."""

    name: str
    owner: str


FOLLOWERS: tuple[Follower, ...] = (
    Follower("train.verl.rollout_name", "train.verl.ENGINE"),
    Follower("train.verl.actor_rft_mini_batch_size", "train.verl.actor_ppo_mini_batch_size"),
    Follower("train.verl.actor_rft_micro_batch_size_per_gpu",
             "train.verl.actor_ppo_micro_batch_size_per_gpu"),
    Follower("train.trl.vllm_gpu_memory_utilization",
             "train.verl.rollout_gpu_memory_utilization"),
    Follower("train.trl.max_prompt_length", "data.data_max_prompt_length"),
    Follower("train.trl.max_completion_length", "data.data_max_response_length"),
    Follower("train.trl.chat_template_kwargs", "data.data_apply_chat_template_kwargs"),
    Follower("eval.max_new_tokens", "data.data_max_response_length"),
    Follower("eval.vllm_gpu_memory_utilization", "train.verl.rollout_gpu_memory_utilization"),
    Follower("eval.correct_reward", "reward.correct_score"),
    # The spec's one setting "for validation/evaluation": verl's validation and eval's.
    Follower("eval.rollout_val_temperature", "train.verl.rollout_val_temperature"),
    Follower("eval.rollout_val_top_p", "train.verl.rollout_val_top_p"),
    Follower("eval.rollout_val_top_k", "train.verl.rollout_val_top_k"),
)


def follow(name: str, value: Any, owner_value: Any) -> Any:
    """The value of follower ``name``: its owner's, when it is unset or the same.

    Raises:
        ConfigError: When it is set to another value than its owner's.
    """
    owner = _FOLLOWED[name]
    if value is None or value == owner_value:
        return owner_value
    raise ConfigError(f"{name}={value!r}: leave it unset (null) or equal to {owner} "
                      f"({owner_value!r}); {owner} sets both")


_FOLLOWED = {f.name: f.owner for f in FOLLOWERS}


def disagreeing_followers(groups: Mapping[str, Any]) -> list[str]:
    """Every follower set to another value than its owner, over validated groups."""
    problems = []
    for f in FOLLOWERS:
        value, owner_value = _lookup(groups, f.name), _lookup(groups, f.owner)
        if value is _ABSENT or owner_value is _ABSENT:
            continue  # a group this configuration does not have
        try:
            follow(f.name, value, owner_value)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def resolve_followers(groups: Mapping[str, Any]) -> dict[str, Any]:
    """``groups`` (validated groups by name) with every follower whose owner's group is there
    set to its owner's value. Done once, before any node runs
    (:class:`rl_pipeline.hooks.WholeConfigurationHook`), so that code reads a follower's own
    field and no node takes another group only to resolve one.

    Raises:
        ConfigError: A follower set to another value than its owner (every one named).
    """
    resolved, problems = dict(groups), []
    for f in FOLLOWERS:
        value, owner_value = _lookup(resolved, f.name), _lookup(resolved, f.owner)
        if value is _ABSENT:
            continue  # a group this configuration does not have
        if owner_value is _ABSENT:
            if value is not None:
                continue  # nothing to disagree with
            # A follower left unset beside no owner group (a node given its own groups
            # only): the owner's default, so that code never reads a null follower.
            owner_value = _owner_default(f.owner)
        try:
            value = follow(f.name, value, owner_value)
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        group, *path = f.name.split(".")
        resolved[group] = _with_value(resolved[group], path, value)
    if problems:
        raise ConfigError("\n".join(problems))
    return resolved


def _leaf_types(annotation: Any) -> set[Any]:
    """The types ``annotation`` admits, through unions, Optional and Annotated."""
    if get_origin(annotation) is Annotated:
        return _leaf_types(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return set().union(*map(_leaf_types, get_args(annotation)))
    return {annotation}


def _number_only(annotation: Any) -> bool:
    """A number is what it takes, and no flag."""
    kinds = _leaf_types(annotation)
    return bool not in kinds and bool(kinds & {int, float})


def _owner_default(owner: str) -> Any:
    from rl_pipeline.params import PARAMETER_GROUPS  # the groups are defined on this base

    group = owner.split(".")[0]
    return _lookup({group: PARAMETER_GROUPS[group]()}, owner)


def _with_value(model: BaseModel, path: list[str], value: Any) -> BaseModel:
    """A copy of the frozen ``model`` with ``value`` at ``path`` (nested groups copied)."""
    head, *rest = path
    return model.model_copy(update={
        head: _with_value(getattr(model, head), rest, value) if rest else value})


def cross_group_problems(groups: Mapping[str, Any]) -> list[str]:
    """Every rule over two groups that a group alone cannot check: the followers
    (:func:`disagreeing_followers`), the overlong buffer inside the response cap, and no
    data source whose built-in reward would run model code on this machine."""
    problems = disagreeing_followers(groups)
    buffer = _lookup(groups, "reward.overlong_buffer_len")
    cap = _lookup(groups, "data.data_max_response_length")
    if _ABSENT not in (buffer, cap) and buffer >= cap:
        problems.append(f"reward.overlong_buffer_len={buffer}: must be below the response cap "
                        f"data.data_max_response_length ({cap}); DAPO uses a buffer of a "
                        "quarter of it or less")
    source, reward = _lookup(groups, "data_prep.data_source"), groups.get("reward")
    if source is not _ABSENT and reward is not None:
        from rl_pipeline.params.reward import model_code_refusal  # it imports this module

        if why := model_code_refusal(source, reward):
            problems.append(f"data_prep.data_source={source!r}: {why}")
    return problems


_ABSENT = object()


def _lookup(groups: Mapping[str, Any], path: str) -> Any:
    node: Any = groups
    for part in path.split("."):
        if isinstance(node, Mapping):
            node = node.get(part, _ABSENT)
        else:
            node = getattr(node, part, _ABSENT)
        if node is _ABSENT:
            return _ABSENT
    return node


class ParamGroup(BaseModel):
    """Base of every parameter group: unknown names are errors; values are checked, frozen.

    ``group`` is where the model lives in ``conf/*/parameters*.yml`` (nested groups are named
    through their parent). Followers inside one group take their owner's value here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    group: ClassVar[str] = ""

    def not_in_effect(self) -> set[str]:
        """The fields that these values make irrelevant (left out of the run's MLflow
        parameters, where they would read as settings the run used)."""
        return set()

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Validate, raising :class:`ConfigError` with every problem named (Kedro shows it)."""
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, cls, cls.group or cls.__name__)) from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_flag_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads true as 1: `rollout_n: true` would sample once.
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and _number_only(annotation):
            raise ValueError("a number, not true or false")
        if isinstance(value, list) and any(isinstance(v, bool) for v in value) and any(
                _number_only(get_args(kind)[0]) for kind in _leaf_types(annotation)
                if get_origin(kind) is list and get_args(kind)):
            raise ValueError("numbers, not true or false")
        return value

    @model_validator(mode="before")
    @classmethod
    def _follow_owners(cls, values: Any) -> Any:
        if not cls.group or not isinstance(values, Mapping):
            return values
        values, problems = dict(values), []
        prefix = cls.group + "."
        for f in FOLLOWERS:
            parent = f.name.rsplit(".", 1)[0]
            if parent == f.owner.rsplit(".", 1)[0] != cls.group:
                continue  # inside a nested group, which resolves it (and its own rules) itself
            if f.name.startswith(prefix) and f.owner.startswith(prefix):
                own = _value_or_default(cls, values, f.owner.removeprefix(prefix))
                try:
                    _update_path(values, f.name.removeprefix(prefix),
                                 lambda v, own=own, name=f.name: follow(name, v, own))
                except ConfigError as exc:
                    problems.append(str(exc))
        if problems:  # pydantic words it with the input; _describe keeps the message only
            raise ValueError("\n  - ".join(problems))
        return values


def _value_or_default(model: type[BaseModel], values: dict[str, Any], path: str) -> Any:
    """The raw value at ``path`` (a.b) of ``values``, else the model's default there."""
    *parents, leaf = path.split(".")
    for part in parents:
        model = model.model_fields[part].annotation
        values = values.get(part) or {}
        if isinstance(values, BaseModel):
            values = values.model_dump()
    if leaf in values:
        return values[leaf]
    return model.model_fields[leaf].get_default(call_default_factory=True)


def _update_path(values: dict[str, Any], path: str, update: Any) -> None:
    *parents, leaf = path.split(".")
    node = values
    for part in parents:
        child = node.get(part) or {}
        node[part] = child = (child.model_dump(exclude_unset=True)
                              if isinstance(child, BaseModel) else dict(child))
        node = child
    node[leaf] = update(node.get(leaf))


# The tag pydantic adds to the location of each member of a union type that refused a value
# (`trainer_n_gpus_per_node.constrained-int`, `...literal['auto']`): not a parameter's name.
_UNION_MEMBER = re.compile(r"(int|float|str|bool|none|constrained-\w+|[\w-]+\[.*\])")


def _union_errors_as_one(errors: list[Any]) -> list[Any]:
    """pydantic's one error per member of a union, as one error of the parameter."""
    merged: list[Any] = []
    by_loc: dict[tuple, Any] = {}
    for err in errors:
        loc = err["loc"]
        if not (loc and isinstance(loc[-1], str) and _UNION_MEMBER.fullmatch(loc[-1])):
            merged.append(err)
            continue
        if loc[:-1] in by_loc:
            first = by_loc[loc[:-1]]
            first["msg"] += "; or " + err["msg"].removeprefix("Input should be ")
            continue
        by_loc[loc[:-1]] = err = {**err, "loc": loc[:-1], "type": "union"}
        merged.append(err)
    return merged


def _describe(exc: ValidationError, model: type[ParamGroup], group: str) -> str:
    errors = _union_errors_as_one(exc.errors())
    lines = [f"{len(errors)} invalid parameter(s) in '{group}':"]
    for err in errors:
        name = ".".join([group, *(str(p) for p in err["loc"])])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(_nested_model(model, err["loc"][:-1]).model_fields))
            lines.append(f"  - {name}: unknown parameter (known: {allowed})")
            continue
        if err["type"] == "value_error" and isinstance(err.get("input"), Mapping):
            # a rule over several fields (a follower): its message names them
            lines.append(f"  - {err['msg'].removeprefix('Value error, ')}")
            continue
        if err["type"] == "missing":  # pydantic's input is then the mapping that lacks it
            lines.append(f"  - {name}: missing (required; given {err.get('input')!r})")
            continue
        lines.append(f"  - {name}={err.get('input')!r}: "
                     f"{err['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def _nested_model(model: type[ParamGroup], loc: tuple) -> type[ParamGroup]:
    for part in loc:
        annotation = model.model_fields[str(part)].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, ParamGroup)):
            break
        model = annotation
    return model
