"""A standalone model from a training result: LoRA merging, verl checkpoint conversion, and
their verification (:mod:`.standalone` puts them together)."""

# Written into the merged model folder: where it came from and how it was verified.
MERGE_METADATA = "merge_metadata.json"


class MergeVerificationError(RuntimeError):
    """The merged model's logits differ from base + adapter beyond the tolerance."""


__all__ = ["MERGE_METADATA", "MergeVerificationError"]
