from kedro.pipeline import Node, Pipeline

from .nodes import check_reward, clean_prompt_splits, fit_prompt_lengths, report_data_prep


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline([
        Node(
            func=clean_prompt_splits,
            inputs=["raw_train", "raw_val", "params:data_prep", "params:data"],
            outputs=["train_work", "val_work", "data_prep_hygiene"],
            name="clean_prompt_splits_node",
        ),
        Node(
            func=fit_prompt_lengths,
            inputs=["train_work", "val_work", "data_prep_hygiene", "base_model",
                    "params:data_prep", "params:data"],
            outputs=["fitted_train_prompts", "fitted_val_prompts", "prompt_lengths"],
            name="fit_prompt_lengths_node",
        ),
        Node(
            func=check_reward,
            inputs=["fitted_train_prompts", "fitted_val_prompts", "params:reward"],
            outputs=["train_prompts", "val_prompts", "reward_self_test"],
            name="check_reward_node",
        ),
        Node(
            func=report_data_prep,
            inputs=["data_prep_hygiene", "prompt_lengths", "reward_self_test", "params:data",
                    "params:data_prep"],
            outputs=["data_prep_report", "data_prep_metrics", "prompt_length_histogram"],
            name="report_data_prep_node",
        ),
    ])
