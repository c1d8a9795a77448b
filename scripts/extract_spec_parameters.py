"""Extract the component specs' parameter facts into docs/reference/spec_parameters.yaml.

A maintainer's tool, run by hand when a spec changes; nothing in the package or the tests
runs it or reads the spec documents (they are not part of this repository)::

    python scripts/extract_spec_parameters.py --spec-dir PATH/TO/spec

It reads the "Inputs" parameter tables (columns Name, Type, Default, Enum) of the three
component specs and writes, per spec, its component name (the spec's "Name" section), its
file name and one entry per parameter in the spec's order: name, type (as the table
writes it), default (a typed YAML value; null where the table has ``-``) and enum (where the
table lists the allowed values). Nothing else: no descriptions.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path
from typing import Any

import yaml

SPEC_FILES = ("verl_trainer_component.md", "rft_trainer_component.md", "grpo_trl_component.md")
OUT = Path(__file__).resolve().parents[1] / "docs" / "reference" / "spec_parameters.yaml"
HEADER = """\
# The component specs' parameters: for each spec (its component name and file), one entry per
# parameter in the spec's order with the name, the type and the default as its table gives
# them (default null: the spec gives none) and the allowed values (enum) where it lists them.
# Facts only, taken from the spec documents' parameter tables (the spec folder beside CI's
# checkout, ../shared/spec; it is not part of this repository).
# Generated; do not edit. Regenerate with
#   python scripts/extract_spec_parameters.py --spec-dir PATH/TO/spec
"""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[+-]?\d+")


def extract(spec_dir: Path, files: tuple[str, ...] = SPEC_FILES) -> list[dict[str, Any]]:
    """The specs' components, each ``{component, file, parameters}``."""
    return [{"component": component_name(text), "file": name, "parameters": parameters(text)}
            for name in files for text in [(spec_dir / name).read_text(encoding="utf-8")]]


def component_name(text: str) -> str:
    """The first line of the spec's ``### Name`` section."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "### Name")
    return next(line.strip() for line in lines[start + 1:] if line.strip())


def parameters(text: str) -> list[dict[str, Any]]:
    """Every parameter row of the tables between ``## Inputs`` and ``## Outputs``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "## Inputs")
    header: list[str] | None = None
    params: list[dict[str, Any]] = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.lstrip().startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
        elif not set("".join(cells)) <= set("-: "):  # not the |---| line
            if len(cells) != len(header):
                raise ValueError(f"{len(cells)} cells under {len(header)} columns: {line}")
            row = dict(zip(header, cells, strict=True))
            if "default" in row:
                params.append(_parameter(row))
    names = [p["name"] for p in params]
    if len(names) != len(set(names)):
        raise ValueError(f"a parameter listed twice: {names}")
    return params


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _parameter(row: dict[str, str]) -> dict[str, Any]:
    name, kind = row["name"], row["type"]
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a parameter name: {name!r}")
    param: dict[str, Any] = {"name": name, "type": kind,
                             "default": typed(row["default"], kind)}
    enum = row.get("enum", "NA")
    if enum not in ("", "NA"):
        values = ast.literal_eval(enum)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{name}: enum {enum!r} is not a list of strings")
        param["enum"] = values
    return param


def typed(default: str, kind: str) -> Any:
    """A default as the table writes it, as a value of the table's type ('-': None)."""
    if default == "-":
        return None
    if default in ("''", '""'):
        return ""
    if kind == "boolean":
        return {"true": True, "false": False}[default.lower()]
    if kind == "integer":
        return int(default)
    if kind == "number":
        return int(default) if _INT.fullmatch(default) else float(default)
    return default  # string, uri_file, uri_folder: the text itself


def to_yaml(components: list[dict[str, Any]]) -> str:
    """The YAML file: the header, then one flow mapping (one line) per parameter."""
    out = [HEADER.rstrip("\n"), "components:"]
    for comp in components:
        out += [f"  - component: {_flow(comp['component'])}",
                f"    file: {_flow(comp['file'])}",
                "    parameters:"]
        out += [f"      - {_flow(param)}" for param in comp["parameters"]]
    text = "\n".join(out) + "\n"
    if yaml.safe_load(text) != {"components": components}:
        raise AssertionError("the YAML does not read back as the parameters extracted")
    return text


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False,
                          width=10_000).removesuffix("\n...\n").rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-dir", type=Path, required=True,
                        help="the folder holding " + ", ".join(SPEC_FILES))
    parser.add_argument("--out", default=str(OUT),
                        help="the YAML file to write ('-': standard output); default %(default)s")
    args = parser.parse_args(argv)
    components = extract(args.spec_dir)
    text = to_yaml(components)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
        counts = ", ".join(f"{c['component']} {len(c['parameters'])}" for c in components)
        print(f"wrote {args.out}: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
