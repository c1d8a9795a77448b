from kedro.pipeline import Node, Pipeline

from .nodes import promote_candidate, promote_run_tags


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=promote_candidate,
            inputs=["eval_registry", "params:registry", "params:promote"],
            outputs="promotion_decision",
            name="promote_candidate_node",
        ),
        Node(
            func=promote_run_tags,
            inputs="promotion_decision",
            outputs="promote_run_tags",
            name="promote_run_tags_node",
        ),
    ])
