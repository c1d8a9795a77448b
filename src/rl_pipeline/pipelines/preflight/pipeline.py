from kedro.pipeline import Node, Pipeline

from rl_pipeline.pipelines.train.nodes import check_training_setup
from rl_pipeline.pipelines.train.pipeline import PREFLIGHT_INPUTS, PREFLIGHT_OUTPUTS


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=check_training_setup,
            inputs=PREFLIGHT_INPUTS,
            outputs=PREFLIGHT_OUTPUTS,
            name="check_training_setup_node",
        ),
    ])
