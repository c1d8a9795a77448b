"""Training engines behind one interface.

The core (this package's modules) is what every engine shares: the interface
(:mod:`~rl_pipeline.engines.base`), the problems a preflight reports
(:mod:`~rl_pipeline.engines.problems`), the lookup by name (:mod:`~rl_pipeline.engines.lookup`)
and the run identity of checkpoints (:mod:`~rl_pipeline.engines.run_identity`). Each engine is
a sub-package (:mod:`~rl_pipeline.engines.verl`, :mod:`~rl_pipeline.engines.trl`) that imports
the core and never another engine. What an engine leaves for merge is described by
:mod:`rl_pipeline.training_result`, which neither side owns.
"""
