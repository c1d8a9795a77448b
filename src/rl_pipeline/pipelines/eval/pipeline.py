from kedro.pipeline import Node, Pipeline

from .nodes import (
    eval_run_tags,
    evaluate_base,
    evaluate_champion,
    evaluate_trained,
    record_eval,
    select_eval_prompts,
    summarize_eval,
)

# train.ray_address: eval refuses a silent CPU fallback where training ran on a Ray cluster
# (check_eval_machine); of the train group it reads nothing else.
_SETTINGS = ["params:eval", "params:data", "params:reward", "params:train.ray_address"]


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=select_eval_prompts,
            inputs=["val_prompts", "base_model", "merged_model", "params:eval"],
            outputs=["eval_prompts", "eval_selection"],
            name="select_eval_prompts_node",
        ),
        Node(
            func=evaluate_base,
            inputs=["eval_prompts", "base_model", *_SETTINGS],
            outputs="base_scored",
            name="evaluate_base_node",
        ),
        Node(
            func=evaluate_trained,
            inputs=["eval_prompts", "merged_model", *_SETTINGS],
            outputs="trained_scored",
            name="evaluate_trained_node",
        ),
        Node(
            func=evaluate_champion,
            inputs=["eval_prompts", "merged_model", "trained_scored", "params:registry",
                    "params:promote", *_SETTINGS],
            outputs=["champion_scored", "champion_model"],
            name="evaluate_champion_node",
        ),
        Node(
            func=summarize_eval,
            inputs=["base_scored", "trained_scored", "champion_scored", "params:eval",
                    "params:data", "params:reward", "eval_selection"],
            outputs=["eval_generations", "eval_generations_table", "eval_metrics",
                     "eval_metrics_mlflow", "eval_report", "eval_chart"],
            name="summarize_eval_node",
        ),
        Node(
            func=record_eval,
            inputs=["eval_metrics", "merged_model", "champion_model", "eval_selection",
                    "params:registry"],
            outputs="eval_registry",
            name="record_eval_node",
        ),
        Node(
            func=eval_run_tags,
            inputs=["eval_metrics", "merged_model", "base_model", "champion_model",
                    "eval_selection", "eval_registry"],
            outputs="eval_run_tags",
            name="eval_run_tags_node",
        ),
    ])
