from kedro.pipeline import Node, Pipeline

from .nodes import check_training_setup, preflight_run_tags

# What identifies a training run (rl_pipeline.engines.run_identity): train_model's inputs.
RUN_INPUTS = ["train_prompts_file", "val_prompts_file", "base_model",
              "train_checkpoints_dir", "params:train", "params:data", "params:reward"]
# The train pipeline starts with the same check (prepare_training), on the same datasets.
# params:eval: the forecast covers eval's time too.
SETUP_INPUTS = [*RUN_INPUTS, "params:eval"]
PREFLIGHT_OUTPUTS = ["train_plan", "preflight_report", "train_config_resolved", "train_command",
                     "preflight_metrics"]


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=check_training_setup,
            inputs=SETUP_INPUTS,
            outputs=PREFLIGHT_OUTPUTS,
            name="check_training_setup_node",
        ),
        Node(
            func=preflight_run_tags,
            inputs="preflight_report",
            outputs="preflight_run_tags",
            name="preflight_run_tags_node",
        ),
    ])
