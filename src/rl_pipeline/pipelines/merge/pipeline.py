from kedro.pipeline import Node, Pipeline

from .nodes import merge_adapter


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=merge_adapter,
            inputs=["lora_adapter", "base_model", "params:merge"],
            outputs=["merged_model", "merge_metadata", "merge_metrics"],
            name="merge_adapter_node",
        ),
    ])
