from kedro.pipeline import Node, Pipeline

from rl_pipeline.pipelines.train.nodes import check_training_setup
from rl_pipeline.pipelines.train.pipeline import PREFLIGHT_OUTPUTS, SETUP_INPUTS


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=check_training_setup,
            inputs=SETUP_INPUTS,
            outputs=PREFLIGHT_OUTPUTS,
            name="check_training_setup_node",
        ),
    ])
