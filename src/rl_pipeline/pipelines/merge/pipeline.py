from kedro.pipeline import Node, Pipeline

from .nodes import merge_model


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=merge_model,
            inputs=["training_result", "base_model", "params:merge"],
            outputs=["merged_model", "merge_metadata", "merge_metrics"],
            name="merge_model_node",
        ),
    ])
