"""rl_pipeline: RL fine-tuning of language models as a Kedro project."""

__version__ = "0.1.0"
