"""Training engines (verl, trl): parameters, preflight checks and launch."""

# Written beside a training result (the adapter folder); the merge stage records it.
TRAINING_RUN = "training_run.json"
