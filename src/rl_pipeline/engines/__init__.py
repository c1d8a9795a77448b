"""Training engines (verl, trl) behind one interface (:mod:`rl_pipeline.engines.base`)."""

# Written beside a training result (the adapter folder); the merge stage records it.
TRAINING_RUN = "training_run.json"

# Engine name (``train.engine``) -> "module:class" of its :class:`~.base.Engine`, imported on
# first use (trl and verl take seconds to import). A new engine is a module and a line here.
ENGINES: dict[str, str] = {
    "verl": "rl_pipeline.engines.verl_engine:VerlEngine",
    "trl": "rl_pipeline.engines.trl_engine:TrlEngine",
}
