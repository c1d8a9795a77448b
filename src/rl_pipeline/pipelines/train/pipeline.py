from kedro.pipeline import Node, Pipeline

from rl_pipeline.pipelines.preflight.pipeline import PREFLIGHT_OUTPUTS, RUN_INPUTS, SETUP_INPUTS

from .nodes import prepare_training, train_model, train_run_tags


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=prepare_training,
            inputs=SETUP_INPUTS,
            outputs=PREFLIGHT_OUTPUTS,
            name="prepare_training_node",
        ),
        Node(
            func=train_model,
            inputs=["train_plan", "train_prompts", "val_prompts", "model_work_dir",
                    *RUN_INPUTS],
            outputs=["training_result", "train_summary", "train_metrics", "reward_curve"],
            name="train_model_node",
        ),
        Node(
            func=train_run_tags,
            inputs=["preflight_report", "train_summary"],
            outputs="train_run_tags",
            name="train_run_tags_node",
        ),
    ])
