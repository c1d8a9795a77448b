"""The component specs' parameters, as the repository records them.

``docs/reference/spec_parameters.yaml`` holds each spec's parameter names, types, defaults
and allowed values (made from the spec documents by ``scripts/extract_spec_parameters.py``);
the tests read nothing outside the repository. The documentation generator
(``scripts/parameter_reference.py``, loaded from its path: ``scripts/`` is no package) reads
that file and owns the one comparison of our defaults with the spec's, :func:`same_default`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.conftest import PROJECT_ROOT

SPEC_PARAMETERS = PROJECT_ROOT / "docs" / "reference" / "spec_parameters.yaml"


def load_script(path: Path) -> ModuleType:
    """A script of ``scripts/`` as a module (once per test session)."""
    name = f"_scripts_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


reference = load_script(PROJECT_ROOT / "scripts" / "parameter_reference.py")
same_default = reference.same_default


def spec_defaults(component: str) -> dict[str, Any]:
    """Parameter name -> default (None: the spec gives none), in the spec's order."""
    (spec,) = [s for s in reference.load_specs(SPEC_PARAMETERS) if s.name == component]
    return spec.defaults()
