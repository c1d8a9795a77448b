from kedro.pipeline import Node, Pipeline

from .nodes import prepare_training, train_model

SETUP_INPUTS = ["train_prompts_file", "val_prompts_file", "base_model",
                "train_checkpoints_dir", "params:train", "params:data", "params:reward"]
PREFLIGHT_OUTPUTS = ["train_plan", "preflight_report", "train_config_resolved", "train_command",
                     "preflight_metrics"]


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
            inputs=["train_plan", "train_prompts", "val_prompts", *SETUP_INPUTS],
            outputs=["training_result", "train_summary", "train_metrics", "reward_curve"],
            name="train_model_node",
        ),
    ])
