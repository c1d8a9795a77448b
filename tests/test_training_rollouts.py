"""The train run's rollout table (rl_pipeline.training_rollouts) against a real MLflow store."""

from __future__ import annotations

import logging

from rl_pipeline.training_rollouts import TABLE, Rollout, log_table


def _rollouts(n: int) -> list[Rollout]:
    return [Rollout(f"What is {i} + 1?", f"#### {i + 1}", str(i + 1), 1.0, False,
                    {"reward_error": 0.0}) for i in range(n)]


def test_each_step_appends_its_rows_and_a_failing_artifact_store_does_not_end_training(
        mlflow_store, caplog) -> None:
    import mlflow

    with mlflow.start_run() as run:
        assert log_table(1, _rollouts(3), limit=2) == 2
        assert log_table(2, _rollouts(3), limit=2) == 2
    table = mlflow.load_table(TABLE, run_ids=[run.info.run_id])
    assert table["step"].tolist() == [1, 1, 2, 2]
    # An artifact store that cannot be written (here a folder under a file): the step's
    # rows are lost with a warning; what raised out of the reward function ended the run.
    (mlflow_store / "a_file").write_text("")
    broken = mlflow.create_experiment("broken", artifact_location=str(
        mlflow_store / "a_file" / "artifacts"))
    with mlflow.start_run(experiment_id=broken), caplog.at_level(logging.WARNING):
        assert log_table(3, _rollouts(3), limit=2) == 0
    assert f"step 3's rollouts were not added to the train run's table {TABLE}" in caplog.text
