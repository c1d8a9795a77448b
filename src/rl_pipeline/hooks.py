"""Project hooks."""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

import mlflow
import yaml
from kedro.framework.context import KedroContext
from kedro.framework.hooks import hook_impl
from kedro.io import AbstractVersionedDataset, DatasetError
from kedro_mlflow.framework.hooks import MlflowHook
from pydantic import BaseModel

from rl_pipeline.errors import terminated
from rl_pipeline.model_registry.names import tag_value
from rl_pipeline.params import (
    PARAMETER_GROUPS,
    ConfigError,
    ParamGroup,
    cross_group_problems,
    resolve_followers,
)
from rl_pipeline.runs.command import stage_command, typed_command
from rl_pipeline.runs.debris import sweep
from rl_pipeline.runs.stage_inputs import check_stage_inputs
from rl_pipeline.runs.stage_lock import COMMAND_STAGES_ENV, StageLocks, is_scheduled
from rl_pipeline.tracking import ARTIFACTS_BAR_ENV
from rl_pipeline.tracking.lineage import (
    end_orphaned_runs,
    git_state,
    process_tags,
)
from rl_pipeline.tracking.stores import uri_credentials


class WholeConfigurationHook:
    """Check every parameter group, and the parameters that follow another, before any node.

    Kedro instantiates the typed groups of the pipelines it runs (``--pipelines data_prep``
    checks only data_prep's), and each stage of a whole `kedro run` is its own session
    (``cli.py``). This makes a typo in the train group, ``eval.max_new_tokens`` set against
    ``data.data_max_response_length`` (:data:`rl_pipeline.params.FOLLOWERS`), or another rule
    over two groups (:func:`rl_pipeline.params.cross_group_problems`) fail any run at once,
    not an hour later when that stage starts. Then it resolves the followers once
    (:func:`rl_pipeline.params.resolve_followers`): nodes read a follower's own field.
    """

    def __init__(self) -> None:
        self._resolved: dict[str, ParamGroup] = {}

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        raw = context.config_loader["parameters"]  # runtime --params included
        unread = (unread_runtime_params(context.config_loader)
                  + unknown_groups(context.config_loader)
                  + two_sources(getattr(context.config_loader, "runtime_params", None) or {}))
        if unread:
            raise ConfigError("\n".join(unread))
        groups, problems = {}, []
        for name, model in PARAMETER_GROUPS.items():
            try:
                groups[name] = model.model_validate(raw.get(name) or {})
            except ConfigError as exc:
                problems.append(str(exc))
        if not problems:
            problems = [f"  - {p}" for p in cross_group_problems(groups)
                        + _gate_problems(groups)]
        if problems:
            raise ConfigError("\n".join(problems))
        self._resolved = resolve_followers(groups)

    @hook_impl
    def after_catalog_created(self, catalog: Any) -> None:
        """Hand the nodes their groups with every follower resolved (``eval.max_new_tokens``
        holds the response cap), in place of the groups Kedro instantiated."""
        for name, group in self._resolved.items():
            # The datasets' own load and save: the catalog's would log each parameter.
            _put_param(catalog, f"params:{name}", group)


def _gate_problems(groups: dict[str, ParamGroup]) -> list[str]:
    """promote's metric and guards that eval, as configured, will not compare."""
    from rl_pipeline.evaluation.promotion import unknown_gate_metrics

    promote, evaluation = groups["promote"], groups["eval"]
    return unknown_gate_metrics(promote.metric, promote.guards, evaluation.samples,
                                evaluation.pass_k)


def _put_param(catalog: Any, key: str, value: Any) -> None:
    """``value`` at ``key`` and at each of its fields' own keys, added where missing (Kedro
    adds ``params:train.ray_address`` only for a group that a node of this run declares by
    type) and replaced where stale, so that a node may take any one field. A group Kedro left
    a plain mapping stays one; a MemoryDataset takes no None, and a resolved follower is
    never None."""
    if key not in catalog:
        catalog[key] = value
    else:
        dataset = catalog[key]
        try:
            current = dataset.load()
        except DatasetError:  # a parameter that is None
            current = None
        if current != value and not (isinstance(current, dict) and isinstance(value, BaseModel)):
            dataset.save(value)
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _put_param(catalog, f"{key}.{name}", getattr(value, name))


_RUNTIME_PARAM = re.compile(r"\$\{runtime_params:\s*([^,}\s]+)")


def unread_runtime_params(loader: Any) -> list[str]:
    """A problem for each `--params` name that nothing in this environment reads: not a
    parameter, and no `${runtime_params:NAME}` of the configuration in effect (an
    environment's catalog entry replaces conf/base's whole, so conf/cpu's generated
    additions do not read `dataset_train_split`). A name nothing reads would otherwise be
    ignored without a word."""
    runtime = getattr(loader, "runtime_params", None) or {}  # a plain mapping has none
    names = [k for k in runtime if k not in PARAMETER_GROUPS and _only_runtime(loader, k)]
    if not names:
        return []
    conf = Path(loader.conf_source)
    envs = [e for e in dict.fromkeys([loader.base_env, loader.env]) if e]
    catalog: dict[str, Any] = {}
    texts = []
    for env in envs:
        for file in sorted((conf / env).rglob("*.yml")):
            text = file.read_text(encoding="utf-8")
            if file.name.startswith("catalog"):
                catalog.update(yaml.safe_load(text) or {})  # the env's entry replaces base's
            else:
                texts.append(text)
    read = set(_RUNTIME_PARAM.findall(yaml.safe_dump(catalog) + "\n".join(texts)))
    where = f"--env {loader.env}" if loader.env else "this environment"
    return [f"--params {name}: nothing in {where} reads it (not a parameter, and no "
            f"catalog entry of conf/{'/, conf/'.join(envs)}/ uses ${{runtime_params:{name}}})"
            + _own_data_hint(name, catalog) for name in names if name not in read]


def two_sources(runtime: dict[str, Any]) -> list[str]:
    """A problem for each input file given beside ``dataset_name``: the raw inputs read the
    Hugging Face dataset's splits then, and the file would be ignored without a word."""
    if not runtime.get("dataset_name"):
        return []
    return [f"--params {name}={runtime[name]}: dataset_name={runtime['dataset_name']} is given "
            "too, and the inputs read that dataset's splits (train; validation, else test) in "
            "place of any file: give dataset_name or the files"
            for name in ("dataset_train_split", "dataset_validation_split")
            if runtime.get(name)]


def unknown_groups(loader: Any) -> list[str]:
    """A problem for each top-level key of a parameters file that is no parameter group: no
    node reads it, so a misspelt group (``data_perp:``) would leave its settings unapplied
    without a word (inside a group, pydantic refuses an unknown name)."""
    import difflib

    if not hasattr(loader, "conf_source"):  # a plain mapping (a test's): no files
        return []
    conf = Path(loader.conf_source)
    problems = []
    for env in dict.fromkeys([loader.base_env, loader.env]):
        for file in sorted((conf / env).rglob("parameters*.yml")) if env else []:
            for key in yaml.safe_load(file.read_text(encoding="utf-8")) or {}:
                if key in PARAMETER_GROUPS or str(key).startswith("_"):  # _: a YAML variable
                    continue
                close = difflib.get_close_matches(str(key), PARAMETER_GROUPS, n=1)
                problems.append(
                    f"{file.relative_to(conf.parent)}: {key!r} is no parameter group"
                    + (f" (did you mean {close[0]!r}?)" if close else "")
                    + f"; nothing reads it. The groups: {', '.join(PARAMETER_GROUPS)}")
    return problems


def _only_runtime(loader: Any, name: str) -> bool:
    """``name`` is in the parameters only because --params put it there."""
    conf = Path(loader.conf_source)
    for env in dict.fromkeys([loader.base_env, loader.env]):
        for file in (conf / env).rglob("parameters*.yml") if env else []:
            if name in (yaml.safe_load(file.read_text(encoding="utf-8")) or {}):
                return False
    return True


# The spec's names for what the catalog provides here (docs/parameters.md, "set in"), and
# the --params name that sets it.
SPEC_INPUTS = {"actor_model_path": "base_model", "model_name_or_path": "base_model",
               "data_train_files": "dataset_train_split",
               "data_val_files": "dataset_validation_split"}


def _own_data_hint(name: str, catalog: dict[str, Any]) -> str:
    ours = SPEC_INPUTS.get(name, name)
    spec = f" (the spec's {name} is {ours} here)" if ours != name else ""
    entries = [k for k, v in catalog.items() if k in ("raw_train", "raw_val")
               and isinstance(v, dict) and "arithmetic" in str(v.get("type", ""))]
    if ours.startswith("dataset_") and entries:
        return (f": this environment's {' and '.join(entries)} are generated additions{spec}; "
                "to train on your own records here, delete those entries from its "
                "catalog.yml (conf/base's JSON Lines inputs, which read dataset_train_split "
                "and dataset_validation_split, then apply), or run without --env")
    if spec:
        made = ("" if ours == "base_model" else ": the raw records data_prep makes the "
                "prompts of both engines from")
        return f". The spec's {name} is set here as --params {ours}=...{made}"
    return ""


class TypedParamsMlflowHook(MlflowHook):
    """kedro-mlflow's hook, logging typed parameter groups field by field.

    Kedro hands nodes our pydantic groups, which kedro-mlflow would log as one long string
    per group; given their plain values it flattens them (``train.trl.learning_rate``) as it
    does dicts. Registered instead of the plugin's own instance (settings.py).
    """

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        os.environ.setdefault(ARTIFACTS_BAR_ENV, "false")  # one set by hand is kept
        # Before kedro-mlflow's set-up, which already asks the server for the experiment.
        refuse_credentials_in_server_uris(_mlflow_server_conf(context))
        super().after_context_created(context)

    @hook_impl
    def before_node_run(self, node: Any, catalog: Any, inputs: dict[str, Any],
                        is_async: bool) -> None:
        plain = {k: _logged(v) for k, v in inputs.items()}
        super().before_node_run(node=node, catalog=catalog, inputs=plain, is_async=is_async)


def _mlflow_server_conf(context: KedroContext) -> dict[str, Any]:
    from kedro.config import MissingConfigException

    patterns = context.config_loader.config_patterns
    patterns.setdefault("mlflow", ["mlflow*", "mlflow*/**", "**/mlflow*"])  # kedro-mlflow's
    try:
        return dict((context.config_loader["mlflow"] or {}).get("server") or {})
    except MissingConfigException:
        return {}


def refuse_credentials_in_server_uris(server: dict[str, Any]) -> None:
    """Refuse a tracking or registry server URI with a login or token in it (mlflow.yml's
    ``server``, else the environment), before any run starts: MLflow prints a server's URI,
    as given, when each run ends ("View run ... at:"), into a terminal, cron's mail or a
    scheduler's log.

    Raises:
        ConfigError: Naming the setting, the URI with its secret masked, and what to do.
    """
    from mlflow.utils.uri import is_http_uri

    for setting, env in (("mlflow_tracking_uri", "MLFLOW_TRACKING_URI"),
                         ("mlflow_registry_uri", "MLFLOW_REGISTRY_URI")):
        given, uri = ((f"mlflow.yml server.{setting}", server[setting]) if server.get(setting)
                      else (env, os.environ.get(env)))
        if uri and is_http_uri(uri) and (shown := uri_credentials(uri)):
            raise ConfigError(
                f"{given}={shown!r}: a URI without credentials. MLflow "
                "prints the server's URI as given when each run ends, so the secret would "
                "be in every log; verl would store it in MLflow too. Give the login as "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or the token as "
                "MLFLOW_TRACKING_TOKEN) in the environment of kedro run")


def _logged(value: Any) -> Any:
    """A node input as its run's parameters show it: a typed group's plain values, less
    those its other values make irrelevant (:meth:`ParamGroup.not_in_effect`: a TRL run
    logged 64 ``train.verl.*`` parameters that did nothing, a greedy eval ``n_samples: 4``)."""
    if not isinstance(value, BaseModel):
        return value
    return value.model_dump(mode="json", exclude=_not_in_effect(value))


def _not_in_effect(value: BaseModel) -> dict[str, Any]:
    """pydantic's ``exclude`` for ``value``: its fields not in effect, and those of the groups
    nested in it (the trl group's, inside ``train``)."""
    unused: dict[str, Any] = dict.fromkeys(
        value.not_in_effect() if isinstance(value, ParamGroup) else (), True)
    for name in type(value).model_fields:
        nested = getattr(value, name)
        if name not in unused and isinstance(nested, ParamGroup) and (
                inner := _not_in_effect(nested)):
            unused[name] = inner
    return unused


class StageInputsHook:
    """Before a stage runs alone, check that what earlier stages write for it is there
    (:mod:`rl_pipeline.runs.stage_inputs`). Registered after :class:`StageLockHook`, so that it
    runs first (pluggy calls the last registered of equal priority first): a refused run
    holds no lock and starts no MLflow run, since Kedro calls no error hook for a failure
    in ``before_pipeline_run``."""

    @hook_impl(tryfirst=True)
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline: Any,
                            catalog: Any) -> None:
        check_stage_inputs(pipeline, catalog, run_params.get("env"))


# Set by `kedro run` for all the stages it runs (src/rl_pipeline/cli.py), or by a scheduler.
EXECUTION_ID_ENV = "RL_PIPELINE_EXECUTION_ID"


def project_folders(context: KedroContext) -> dict[str, Path]:
    """The folders of ``folders`` in conf/*/globals.yml (stated there once, for the catalog
    and the hooks), absolute under the project folder."""
    try:
        folders = context.config_loader["globals"]["folders"]
    except KeyError:
        raise ConfigError("conf/base/globals.yml: no 'folders' mapping (data, locks, "
                          "resolved_models); the project's hooks and catalog read them") from None
    return {name: Path(context.project_path) / value for name, value in folders.items()}


class StageLockHook:
    """Take the lock of each stage a run covers (see :mod:`rl_pipeline.runs.stage_lock`), in
    ``folders.locks`` (globals.yml)."""

    def __init__(self) -> None:
        self._locks: StageLocks | None = None
        self._folder: Path | None = None

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        self._folder = project_folders(context)["locks"]

    @hook_impl(tryfirst=True)  # before kedro-mlflow starts a run: a refused run leaves none
    def before_pipeline_run(self, run_params: dict[str, Any]) -> None:
        from rl_pipeline.pipeline_registry import STAGES

        names = run_params.get("pipeline_names") or ["__default__"]
        stages = [s for s in STAGES if s in names or "__default__" in names]
        self._locks = StageLocks(self._folder)
        scheduled = is_scheduled()
        if scheduled:  # the command's later stages too: refused before any work, or not
            command = os.environ.get(COMMAND_STAGES_ENV, "").split(",")
            later = [s for s in command if s in STAGES and s not in stages
                     and STAGES.index(s) > max(map(STAGES.index, stages), default=-1)]
            self._locks.check_free(later)
        self._locks.acquire(stages, scheduled=scheduled)

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._release()

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._release()

    def _release(self) -> None:
        if self._locks is not None:
            self._locks.release()


class LeftoversHook:
    """Before a run writes anything, remove what killed runs left (:mod:`rl_pipeline.runs.debris`):
    hidden half-written files and work folders under ``folders.data`` (globals.yml), in the
    system's temporary folder and in the catalog's ``model_work_dir``."""

    def __init__(self) -> None:
        self._data: list[Path] = []

    @hook_impl
    def after_context_created(self, context: KedroContext) -> None:
        self._data = [project_folders(context)["data"]]

    @hook_impl
    def before_pipeline_run(self, catalog: Any) -> None:
        flat = [Path(tempfile.gettempdir())]
        if "model_work_dir" in catalog:  # a folder outside data/ is swept too
            flat.append(Path(catalog["model_work_dir"].load()))
        sweep(self._data, flat=flat)


class LineageHook:
    """Tag each stage's MLflow run with what a reviewer needs to trace and reproduce it.

    kedro-mlflow already tags the Kedro run id (``run_id``), env and pipeline. This replaces
    its ``kedro_command`` with the command the user typed (kedro-mlflow's, for the one stage
    the run holds, becomes ``stage_command``), and adds the pipeline execution (the stages
    of one `kedro run` are separate MLflow runs and share ``pipeline_execution_id``), the
    git commit and whether the tree was dirty, every versioned dataset's loaded and saved
    version, and the error of a run that fails. It tags the host and pid too, so that the
    next run can mark KILLED the runs of processes that died without a word (SIGKILL, out of
    memory), instead of leaving them RUNNING.

    What is particular to a stage (the engine, the verdict, the decision) the stage tags
    itself: a node returns it as ``<stage>_run_tags``, which the catalog sets on the run.
    """

    def __init__(self) -> None:
        self._catalog = None

    @hook_impl
    def after_catalog_created(self, catalog: Any) -> None:
        self._catalog = catalog

    @hook_impl(trylast=True)  # after kedro-mlflow has started the run
    def before_pipeline_run(self, run_params: dict[str, Any]) -> None:
        run = mlflow.active_run()
        if run is None:  # tracking disabled for this pipeline
            return
        command = typed_command()
        names = run_params.get("pipeline_names") or [run_params.get("pipeline_name")
                                                     or "__default__"]
        stage = stage_command(",".join(names))
        mlflow.set_tags({"pipeline_execution_id": os.environ.get(EXECUTION_ID_ENV)
                         or uuid.uuid4().hex, **git_state(Path(run_params["project_path"])),
                         **process_tags(),
                         # what was typed, and the same for this stage alone
                         **({"kedro_command": command, "stage_command": stage}
                            if command else {})})
        end_orphaned_runs(mlflow.MlflowClient(), run.info.experiment_id, run.info.run_id)

    @hook_impl
    def after_dataset_loaded(self, dataset_name: str) -> None:
        self._tag_version("loaded", dataset_name, "resolve_load_version")

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        self._tag_version("saved", dataset_name, "resolve_save_version")

    @hook_impl(tryfirst=True)  # before kedro-mlflow ends the run as FAILED
    def on_pipeline_error(self, error: Exception) -> None:
        if mlflow.active_run() is not None:
            error = terminated(error) or error  # a stop, not what it interrupted
            mlflow.set_tag("error", tag_value(f"{type(error).__name__}: {error}"))

    def _tag_version(self, action: str, name: str, resolve: str) -> None:
        if mlflow.active_run() is None or self._catalog is None:
            return
        dataset = self._catalog.get(name)
        if isinstance(dataset, AbstractVersionedDataset):
            try:
                version = getattr(dataset, resolve)()
            except DatasetError:  # an optional input with no version yet (merged_model)
                version = "none"
            if version is not None:  # None: a versionable type the catalog does not version
                mlflow.set_tag(f"dataset.{action}.{name}", version)
