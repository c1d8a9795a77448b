"""Draw a pipeline with kedro-viz and save it as a PNG (docs/images/pipeline.png by default).

    .venv/bin/python scripts/pipeline_png.py [--env cpu] [--pipeline __default__] [--output PATH]

This is what `kedro viz run` shows, taken by headless Chromium. The project is loaded as
kedro-viz loads it (without hooks: nothing runs and nothing is written to the project), the
static site that `kedro viz build` makes (the web UI and its API responses) is written to a
temporary folder and served on 127.0.0.1. The UI starts with the sidebar, minimap and feature
hints closed and the light theme, as its own settings would leave it, and shows task nodes,
datasets and parameters. Chromium resolves no host but 127.0.0.1 (no web fonts, no
analytics), and nothing asks for newer versions.
Needs Chromium (`apt-get install chromium`; or set CHROMIUM) and ImageMagick's `convert`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

PROJECT_ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
# The PNG text chunk that says what the picture draws (:func:`drawn`).
DRAWN_KEY = "kedro-pipeline"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def build(project: Path, env: str | None, folder: Path) -> Path:
    """What `kedro viz build` writes (kedro-viz's web UI and its API responses for every
    registered pipeline), in ``folder/build``; the build folder."""
    from kedro.framework.startup import bootstrap_project
    from kedro_viz.integrations.deployment.local_deployer import LocalDeployer
    from kedro_viz.server import load_and_populate_data

    metadata = bootstrap_project(project)
    load_and_populate_data(project, env=env, package_name=metadata.package_name)
    cwd = Path.cwd()
    os.chdir(folder)  # LocalDeployer writes ./build
    try:
        LocalDeployer().deploy(is_all_previews_enabled=False)
    finally:
        os.chdir(cwd)
    return folder / "build"


def drawn(pipeline: str) -> str:
    """What a picture of the registered ``pipeline`` shows, as JSON: its task nodes, its
    datasets and parameters, and the edges between them, sorted (the project must be
    bootstrapped: :func:`build`)."""
    from kedro.framework.project import pipelines

    graph = pipelines[pipeline]
    edges = {(data, n.name) for n in graph.nodes for data in n.inputs} | \
        {(n.name, data) for n in graph.nodes for data in n.outputs}
    return json.dumps({"pipeline": pipeline, "nodes": sorted(n.name for n in graph.nodes),
                       "data": sorted(graph.all_inputs() | graph.all_outputs()),
                       "edges": sorted(f"{a} -> {b}" for a, b in edges)})


def preset(site: Path, settings: dict) -> None:
    """Start the UI with these settings, as if chosen in its settings panel (they live in the
    browser's localStorage under "KedroViz")."""
    index = site / "index.html"
    value = json.dumps(json.dumps(settings))
    script = f"<script>localStorage.setItem('KedroViz', {value});</script>"
    index.write_text(index.read_text(encoding="utf-8").replace("<head>", "<head>" + script, 1),
                     encoding="utf-8")


def serve(site: Path) -> tuple[ThreadingHTTPServer, str]:
    """A static file server for ``site`` on 127.0.0.1, in a thread; (server, url)."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = ThreadingHTTPServer((HOST, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{HOST}:{server.server_address[1]}/"


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass


def browser() -> str:
    for name in ([os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else BROWSERS):
        if path := shutil.which(name):
            return path
    sys.exit("pipeline_png: no Chromium found (apt-get install chromium, or set CHROMIUM)")


def screenshot(url: str, out: Path, size: tuple[int, int], wait_ms: int, profile: Path) -> None:
    command = [
        browser(), "--headless", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
        f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--disable-default-apps", "--metrics-recording-only",
        # Only the local app: every other host name fails to resolve.
        f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {HOST}",
        f"--window-size={size[0]},{size[1]}", f"--virtual-time-budget={wait_ms}",
        f"--screenshot={out}", url,
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    if result.returncode != 0 or not out.exists():
        sys.exit(f"pipeline_png: Chromium failed ({result.returncode}):\n{result.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default=os.environ.get("KEDRO_ENV", "cpu"),
                        help="Kedro environment to load (default: cpu)")
    parser.add_argument("--pipeline", default="__default__", help="registered pipeline to draw")
    parser.add_argument("--output", type=Path, default=PROJECT_ROOT / "docs/images/pipeline.png")
    parser.add_argument("--project", type=Path, default=PROJECT_ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--theme", choices=["light", "dark"], default="light")
    # Tall enough for the whole default pipeline (every stage's tag and registry nodes) at a
    # zoom whose labels stay legible once scaled to --width.
    parser.add_argument("--window", default="1900x2400", help="browser window, WIDTHxHEIGHT")
    parser.add_argument("--width", type=int, default=1600, help="final width in pixels at most")
    parser.add_argument("--wait-ms", type=int, default=15000,
                        help="browser time for the UI to lay the graph out")
    args = parser.parse_args(argv)
    os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")
    window = tuple(int(v) for v in args.window.lower().split("x"))

    with tempfile.TemporaryDirectory(prefix="pipeline_png.") as tmp:
        tmp = Path(tmp)
        site = build(args.project.resolve(), args.env, tmp)
        if not (site / "api/pipelines" / args.pipeline).exists():
            names = sorted(p.name for p in (site / "api/pipelines").iterdir())
            sys.exit(f"pipeline_png: no pipeline {args.pipeline!r}; registered: {names}")
        preset(site, {"theme": args.theme, "showFeatureHints": False,
                      "visible": {"sidebar": False, "miniMap": False}})
        server, url = serve(site)
        query = urlencode({"pid": args.pipeline, "types": "nodes,datasets,parameters",
                           "expandAllPipelines": "true"}, safe=",")
        raw = tmp / "raw.png"
        try:
            screenshot(f"{url}?{query}", raw, window, args.wait_ms, tmp / "chromium")
        finally:
            server.shutdown()
        # Keep the picture as the browser drew it, scaled down to at most --width pixels wide,
        # as an 8-bit palette PNG (a fraction of the size, no visible loss on a flat UI).
        subprocess.run(["convert", str(raw), "-resize", f"{args.width}x>", "-strip",
                        "-colors", "256", f"PNG8:{tmp / 'small.png'}"], check=True)
        # What it draws goes in as a text chunk (convert's -strip drops its own), so that a
        # test can tell a picture drawn before the pipeline changed (tests/test_viz.py).
        from PIL import Image, PngImagePlugin

        from rl_pipeline.runs.staging import staged

        text = PngImagePlugin.PngInfo()
        text.add_text(DRAWN_KEY, drawn(args.pipeline))
        with Image.open(tmp / "small.png") as image, staged(args.output) as staging:
            image.save(staging, format="PNG", pnginfo=text, optimize=True)
    print(f"{args.output}: {args.pipeline} ({args.env}), {args.output.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
