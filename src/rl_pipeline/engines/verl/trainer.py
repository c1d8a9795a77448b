"""verl's sync trainer as the pipeline runs it, on GPUs and on a CPU: verl's own loop, plus
what the train run shows of each step's rollouts.

:class:`PipelinePPOTrainerSync` is verl 0.9.1's ``PPOTrainerSync`` with two additions, both
through methods verl's trainer calls on itself:

- after verl computes a step's metrics, the step's rollouts (prompt, response, reward and
  the reward's parts, read from verl's TransferQueue before it is cleared) go to the train
  run as eval's degeneration rates and the reward parts' means (``rollouts/...`` metrics,
  logged with verl's) and a few rows of the table ``train/rollouts.json``
  (:mod:`rl_pipeline.training_rollouts`);
- the sync replay buffer polls for finished rollouts every :data:`REPLAY_POLL_S` instead of
  verl's 2 s, a whole CPU rollout's time;
- it hands the trainer a step's samples in the order of their tokens
  (:func:`in_content_order`), not in the order they finished, so that a run repeats.

:class:`PipelineTaskRunner` is verl's v1 TaskRunner building it (``run_ppo(task_runner_class=
...)``, the hook verl documents for recipes). Both lean on verl internals listed in
:data:`VERL_INTERNALS` and checked by a test, so that a verl upgrade that moves one fails
loudly instead of silently running another code path.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import ray
from omegaconf import DictConfig, OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from rl_pipeline.engines.forecast import FIRST_STEP_METRIC, first_step_message
from rl_pipeline.engines.verl.config import TRAINER_SETTINGS
from rl_pipeline.training_rollouts import Rollout, last_user_turn, log_table, step_metrics

logger = logging.getLogger(__name__)
REPLAY_POLL_S = 0.05
ROLLOUT_FIELDS = ["raw_prompt", "responses", "response_mask", "rm_scores", "reward_model",
                  "extra_fields"]


# What this module takes from verl beyond its documented hooks: (what, why).
VERL_INTERNALS = (
    ("verl.trainer.main_ppo.TaskRunnerV1.run", "copied into PipelineTaskRunnerBase.run to "
     "build the pipeline's trainer instead of the registered 'sync' one"),
    ("verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.poll_interval", "how often the sync "
     "buffer polls for finished rollouts (no setting in 0.9.1)"),
    ("verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_metrics", "called with the step's "
     "batch still in the TransferQueue, and the metrics verl logs next"),
    ("verl.trainer.ppo.v1.replay_buffer.ReplayBuffer._materialize_batch", "wrapped to order "
     "a step's samples by their tokens (in_content_order)"),
)


def check_trainer_internals() -> list[str]:
    """What of :data:`VERL_INTERNALS` the installed verl no longer has (empty: all there)."""
    import inspect

    from verl.trainer.ppo.v1 import replay_buffer, trainer_base

    missing = []
    run_source = inspect.getsource(TaskRunnerV1.__ray_actor_class__.run)
    if "get_trainer_cls" not in run_source or "init_agent_loop_manager" not in run_source:
        missing.append(VERL_INTERNALS[0][0])
    buffer_source = inspect.getsource(replay_buffer.ReplayBuffer)
    if "time.sleep(self.poll_interval)" not in buffer_source:
        missing.append(VERL_INTERNALS[1][0])
    fit_source = inspect.getsource(trainer_base.PPOTrainer.fit)
    metrics_at = fit_source.find("self._compute_metrics(batch, metrics")
    if metrics_at < 0 or not (metrics_at < fit_source.find("tq.kv_clear", metrics_at)
                              < fit_source.find("self.logger.log(data=metrics", metrics_at)):
        missing.append(VERL_INTERNALS[2][0])
    sample_source = inspect.getsource(replay_buffer.ReplayBuffer.sample)
    if "return self._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)" \
            not in sample_source:
        missing.append(VERL_INTERNALS[3][0])
    return missing


def in_content_order(materialize: Any) -> Any:
    """verl's ``ReplayBuffer._materialize_batch``, with the batch's samples ordered by their
    prompt and response tokens.

    verl orders them as they were written to the TransferQueue, that is as they finished:
    another order each run. The actor's LoRA dropout then draws its masks for other samples,
    and a batch summed in another order rounds otherwise, so two runs of one seed parted
    after their first update (docs/benchmarks.md, "Run to run"). The order of the tokens is
    the same every run: identical samples are interchangeable.
    """
    import dataclasses

    import transfer_queue as tq

    def ordered(partition_id: str, selected_prompt_uids: list[str],
                partition_snapshot: dict[str, dict]) -> Any:
        batch = materialize(partition_id, selected_prompt_uids, partition_snapshot)
        if len(batch.keys) < 2:
            return batch
        data = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id,
                               select_fields=["prompts", "responses"])
        # Bytes compare in C: cheap for a GPU batch of thousands of samples.
        content = [(p.cpu().numpy().tobytes(), r.cpu().numpy().tobytes())
                   for p, r in zip(data["prompts"].unbind(), data["responses"].unbind(),
                                   strict=True)]
        order = sorted(range(len(batch.keys)), key=content.__getitem__)
        return dataclasses.replace(batch, keys=[batch.keys[i] for i in order],
                                   tags=[batch.tags[i] for i in order])

    return ordered


class PipelinePPOTrainerSync(PPOTrainerSync):
    """verl's sync trainer, logging each step's rollouts (module docstring)."""

    def _build_replay_buffer(self) -> Any:
        buffer = super()._build_replay_buffer()
        buffer.poll_interval = REPLAY_POLL_S
        buffer._materialize_batch = in_content_order(buffer._materialize_batch)
        return buffer

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int,
                         epoch: int) -> Any:
        out = super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        rollouts = self._rollouts(batch)
        metrics.update(step_metrics(rollouts))
        settings = OmegaConf.select(self.config, TRAINER_SETTINGS) or {}
        log_table(global_steps, rollouts, int(settings.get("rollouts_logged_per_step", 0)))
        forecast = settings.get("first_step_forecast_s")
        if forecast and not getattr(self, "_first_step_seen", False) and "step" in timing_raw:
            self._first_step_seen = True  # this run's first step (a resumed run's too)
            metrics[FIRST_STEP_METRIC] = timing_raw["step"]
            logger.log(*first_step_message(global_steps, timing_raw["step"], float(forecast)))
        return out

    def _rollouts(self, batch: Any) -> list[Rollout]:
        """The step's samples, decoded, with their rewards and the reward's parts."""
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=ROLLOUT_FIELDS)
        cap = int(self.config.data.max_response_length)
        stop = {i for i in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
                if i is not None}
        padding = [tag.get("is_padding", False) for tag in batch.tags]
        rows = list(zip(_values(data["raw_prompt"]), data["responses"].unbind(),
                        data["response_mask"].unbind(), data["rm_scores"].unbind(),
                        _values(data["reward_model"]), _values(data["extra_fields"]),
                        strict=True))
        rollouts = []
        # A prompt's samples together, as TRL orders them: the keys are uid_session_index.
        for i in sorted(range(len(rows)), key=lambda i: batch.keys[i]):
            prompt, response, mask, scores, truth, extra = rows[i]
            if padding[i]:
                continue
            tokens = response[mask.bool()].tolist()
            info = (extra or {}).get("reward_extra_info", {}) if isinstance(extra, dict) else {}
            rollouts.append(Rollout(
                prompt=last_user_turn(prompt),
                response=self.tokenizer.decode(tokens, skip_special_tokens=True),
                ground_truth=str((truth or {}).get("ground_truth", "")),
                reward=float(scores.sum()),
                truncated=len(tokens) >= cap and bool(tokens) and tokens[-1] not in stop,
                # verl keeps the whole dict our reward returned: its "score" is the reward.
                parts={k: float(v) for k, v in info.items() if k != "score"
                       and isinstance(v, int | float) and not isinstance(v, bool)}))
        return rollouts


def _values(field: Any) -> list[Any]:
    """A TransferQueue field of Python objects as a list (a stack, or a list already)."""
    return list(field) if isinstance(field, list) else field.tolist()


class PipelineTaskRunnerBase(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 TaskRunner (``run`` as in verl 0.9.1), building :attr:`trainer_class` for
    the sync mode and verl's registered trainer for the others."""

    trainer_class: ClassVar[type] = PipelinePPOTrainerSync

    def run(self, config: DictConfig) -> None:
        import transfer_queue as tq
        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl.utils.logging_utils import configure_verl_logging

        configure_verl_logging()
        # This actor's log lines reach the driver's console (Ray forwards its stderr).
        ours = logging.getLogger("rl_pipeline")
        if not ours.handlers:
            ours.addHandler(logging.StreamHandler())
            ours.setLevel(logging.INFO)
            ours.propagate = False  # verl's root handler would print each line again
        mode = config.trainer.v1.trainer_mode
        trainer_cls = self.trainer_class if mode == "sync" else get_trainer_cls(mode)
        config.transfer_queue.enable = True
        OmegaConf.resolve(config)
        self.config = config
        tq.init(config.transfer_queue)
        succeeded = False
        try:
            self.trainer = trainer_cls(config=config)
            self.trainer.init()
            self.init_agent_loop_manager()
            self.trainer.fit(self.agent_loop_manager)
            succeeded = True
        finally:
            try:
                tracking = getattr(self.trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()


PipelineTaskRunner = ray.remote(PipelineTaskRunnerBase)
