from kedro.pipeline import Node, Pipeline

from .nodes import merge_model, merge_run_tags, publish_merged_model


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=merge_model,
            inputs=["training_result", "base_model", "model_work_dir", "params:merge",
                    "params:registry"],
            outputs=["merged_model", "merge_metadata", "merge_metrics"],
            name="merge_model_node",
        ),
        Node(
            func=publish_merged_model,
            inputs=["merged_model", "params:registry"],
            outputs="registered_model",
            name="publish_merged_model_node",
        ),
        Node(
            func=merge_run_tags,
            inputs="merge_metadata",
            outputs="merge_run_tags",
            name="merge_run_tags_node",
        ),
    ])
