from kedro.pipeline import Node, Pipeline

from .nodes import promote_candidate


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=promote_candidate,
            inputs=["eval_registry", "params:registry", "params:promote"],
            outputs="promotion_decision",
            name="promote_candidate_node",
        ),
    ])
