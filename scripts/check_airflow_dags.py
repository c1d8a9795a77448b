"""Load generated DAGs with Airflow's own DagBag, as its DAG processor would, and describe them.

Run it with an Airflow environment's Python (`make airflow-check` makes one in
.venv-airflow), not the project's: Airflow pins many packages that the project also uses.

    .venv-airflow/bin/python scripts/check_airflow_dags.py airflow_dags [--json FILE]

Prints each DAG's id, schedule and tasks with their upstream tasks and retries; exits 1 if a
file fails to import or two files define the same dag_id. --json writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def describe(folder: Path) -> dict:
    """Each DAG in ``folder`` as Airflow's DagBag loads it, and the files that failed."""
    if "AIRFLOW_HOME" in os.environ:
        return _describe(folder)
    # Parsing needs an AIRFLOW_HOME but no database or scheduler; Airflow writes its config
    # there, so it goes when the check ends (one was left in /tmp per check before).
    with tempfile.TemporaryDirectory(prefix="airflow-home-") as home:
        os.environ["AIRFLOW_HOME"] = home
        try:
            return _describe(folder)
        finally:
            del os.environ["AIRFLOW_HOME"]


def _describe(folder: Path) -> dict:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder))
    files = sorted(p.name for p in folder.glob("*.py"))
    return {
        "files": files,
        "import_errors": {Path(k).name: str(v) for k, v in bag.import_errors.items()},
        "dags": {dag_id: {
            "file": Path(dag.fileloc).name,
            "schedule": dag.schedule if dag.schedule is None or isinstance(dag.schedule, str)
            else repr(dag.schedule),
            "max_active_runs": dag.max_active_runs,
            "catchup": dag.catchup,
            "tasks": {t.task_id: {"upstream": sorted(t.upstream_task_ids), "retries": t.retries}
                      for t in dag.topological_sort()},
        } for dag_id, dag in sorted(bag.dags.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, help="also write the description here")
    args = parser.parse_args()
    found = describe(args.folder)
    if args.json:
        args.json.write_text(json.dumps(found, indent=2))
    for dag_id, dag in found["dags"].items():
        print(f"{dag_id} ({dag['file']}): schedule {dag['schedule']}")
        for task_id, task in dag["tasks"].items():
            after = f" after {', '.join(task['upstream'])}" if task["upstream"] else ""
            print(f"  {task_id}{after}, retries {task['retries']}")
    problems = [f"{name}: {error}" for name, error in found["import_errors"].items()]
    if len(found["dags"]) < len(found["files"]):
        problems.append(f"{len(found['files'])} DAG files but {len(found['dags'])} distinct "
                        "dag_ids: some files share one, and Airflow keeps only one of them")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
