"""Why did verl's rollout disagree with its actor? The recorded steps, scored again.

Run the training with ``+actor_rollout_ref.rollout.custom.hf_rollout.agreement_dir=DIR``
in ``train.verl.overrides`` (the CPU mode), then::

    python scripts/rollout_agreement.py DIR MODEL_FOLDER --temperature 0.6

MODEL_FOLDER is the resolved base model (``data/06_models/resolved/<name>``). Each step's
line gives verl's own measure (rollout against actor: the Pearson correlation of the token
probabilities, and their mean and largest gap) and each side against the same tokens scored
again in float32 and bfloat16 with the adapter the rollout held, and in float32 with the
adapter before it (:mod:`rl_pipeline.engines.verl.agreement` says how to read them).
"""

from __future__ import annotations

import argparse
import json

from rl_pipeline.engines.verl.agreement import RECOMPUTED, Agreement, agreement_report


def _cell(a: Agreement) -> str:
    return f"{a.pearson:.4f} / {a.mean_diff:.4f} / {a.max_diff:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the run's hf_rollout.agreement_dir")
    parser.add_argument("model", help="the base model folder the run trained")
    parser.add_argument("--temperature", type=float, required=True,
                        help="train.verl.rollout_temperature")
    parser.add_argument("--json", action="store_true", help="one JSON object per step")
    args = parser.parse_args()
    rows = agreement_report(args.folder, args.model, args.temperature)
    if args.json:
        for row in rows:
            print(json.dumps(row, default=lambda a: a.__dict__))
        return
    names = [name for name, _, _ in RECOMPUTED]
    print("Cells: pearson / mean gap / largest gap of the token probabilities.")
    print("| step | tokens | rollout vs actor | "
          + " | ".join(f"rollout vs {n} | actor vs {n}" for n in names) + " |")
    print("|---" * (3 + 2 * len(names)) + "|")
    for row in rows:
        cells = [str(row["step"]), str(row["tokens"]), _cell(row["rollout vs actor"])]
        for name in names:
            pair = row.get(name)
            cells += [_cell(pair["rollout"]), _cell(pair["actor"])] if pair else ["-", "-"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
