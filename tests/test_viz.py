"""kedro-viz draws every registered pipeline: its nodes, datasets, parameters and edges.

The graphs are kedro-viz's own: the project is loaded the way `kedro viz run` loads it
(``kedro_viz.server.load_and_populate_data``, without the project's hooks), and each
pipeline's graph is the JSON that kedro-viz serves at ``/api/pipelines/<name>``. Loading
reads the configuration and builds the catalog; nothing is run, and nothing is written to
data/ or the MLflow store. Run alone it takes about 10 s, nearly all of it importing the
project's node modules (trl, transformers) that the rest of the suite imports anyway;
kedro-viz's own part is under a second.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kedro.framework.project import pipelines as registered_pipelines
from kedro.framework.startup import bootstrap_project
from kedro.pipeline import Pipeline
from kedro_viz.api.rest.responses.pipelines import get_kedro_project_json_data
from kedro_viz.data_access import data_access_manager
from kedro_viz.server import load_and_populate_data

from rl_pipeline.pipeline_registry import STAGES
from tests.conftest import PROJECT_ROOT

PIPELINE_NAMES = ("__default__", "preflight", *STAGES)


@pytest.fixture(scope="module")
def project() -> dict[str, Pipeline]:
    """The project loaded into kedro-viz's data access manager (conf/cpu); its pipelines."""
    metadata = bootstrap_project(PROJECT_ROOT)
    data_access_manager.reset_fields()
    load_and_populate_data(PROJECT_ROOT, env="cpu", package_name=metadata.package_name)
    yield dict(registered_pipelines)
    data_access_manager.reset_fields()


@pytest.fixture(scope="module")
def graphs(project: dict[str, Pipeline]) -> dict[str, dict[str, Any]]:
    """kedro-viz's graph of each registered pipeline, as its REST API serves it."""
    return {name: get_kedro_project_json_data(name) for name in project}


def by_name(graph: dict[str, Any], node_type: str) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in graph["nodes"] if n["type"] == node_type}


def test_every_registered_pipeline_is_offered(project, graphs):
    assert set(PIPELINE_NAMES) <= set(project)
    for name, graph in graphs.items():
        assert graph["selected_pipeline"] == name
        assert {p["id"] for p in graph["pipelines"]} == set(project)


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_graph_has_the_pipelines_nodes_datasets_and_parameters(project, graphs, name):
    pipeline, graph = project[name], graphs[name]
    assert pipeline.nodes, name

    tasks = by_name(graph, "task")
    assert set(tasks) == {node.name for node in pipeline.nodes}
    for node in pipeline.nodes:
        assert tasks[node.name]["full_name"] == node.name
        assert name in tasks[node.name]["pipelines"]

    names = pipeline.all_inputs() | pipeline.all_outputs()
    assert set(by_name(graph, "data")) == {d for d in names if not d.startswith("params:")}
    params = {d for d in names if d.startswith("params:")}
    assert params, f"{name} reads no parameters"
    assert set(by_name(graph, "parameters")) == params
    assert {n["type"] for n in graph["nodes"]} == {"task", "data", "parameters"}


@pytest.mark.parametrize("name", PIPELINE_NAMES)
def test_edges_are_the_pipelines_inputs_and_outputs(project, graphs, name):
    pipeline, graph = project[name], graphs[name]
    ids = {n["name"]: n["id"] for n in graph["nodes"]}
    expected = set()
    for node in pipeline.nodes:
        expected |= {(ids[d], ids[node.name]) for d in node.inputs}
        expected |= {(ids[node.name], ids[d]) for d in node.outputs}
    assert {(e["source"], e["target"]) for e in graph["edges"]} == expected


@pytest.mark.parametrize("name", ["train", "__default__"])
def test_train_prompts_flow_from_data_prep_into_training(graphs, name):
    graph = graphs[name]
    ids = {n["name"]: n["id"] for n in graph["nodes"]}
    edges = {(e["source"], e["target"]) for e in graph["edges"]}
    assert (ids["train_prompts"], ids["train_model_node"]) in edges
    assert (ids["params:train"], ids["train_model_node"]) in edges
    assert (ids["train_model_node"], ids["training_result"]) in edges
    if name == "__default__":  # the whole chain: data_prep writes what train reads
        producers = {s for s, t in edges if t == ids["train_prompts"]}
        assert len(producers) == 1
        (producer,) = producers
        assert {"data_prep", "__default__"} <= set(
            next(n for n in graph["nodes"] if n["id"] == producer)["pipelines"])


def test_datasets_carry_their_catalog_types_and_nodes_their_parameters(graphs):
    graph = graphs["__default__"]
    data = by_name(graph, "data")
    assert data["train_prompts"]["dataset_type"].endswith("atomic.ParquetDataset")
    assert data["base_model"]["dataset_type"].endswith("model_source.ModelSourceDataset")
    assert data["train_plan"]["dataset_type"].endswith("MemoryDataset")  # not in the catalog
    # kedro-viz shows a node's parameters as the environment resolves them (conf/cpu here).
    train = by_name(graph, "task")["train_model_node"]
    assert train["parameters"]["train"]["engine"] == "trl"
    assert train["parameters"]["train"]["trl"]["max_steps"] == 40  # conf/cpu: 40, base: -1


def test_the_readmes_picture_draws_the_default_pipeline_as_it_is(project):
    """docs/images/pipeline.png carries what it drew (scripts/pipeline_png.py writes it in
    a text chunk): a node or dataset added since makes it stale, and this says how to redraw
    it."""
    from PIL import Image

    from tests.conftest import load_script

    script = load_script("pipeline_png")
    with Image.open(PROJECT_ROOT / "docs/images/pipeline.png") as image:
        drawn = json.loads(image.info.get(script.DRAWN_KEY, "null"))
    now = json.loads(script.drawn("__default__"))  # the project is loaded (the fixture)
    assert len(now["nodes"]) == len(project["__default__"].nodes) > 10
    assert drawn == now, ("docs/images/pipeline.png does not draw the default pipeline as it "
                          "is now: redraw it with `make viz-png`")
