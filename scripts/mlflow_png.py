"""A page of MLflow's UI as a PNG, taken by headless Chromium (for the docs' pictures).

    .venv/bin/python scripts/mlflow_png.py PROJECT --artifact train/rollouts.json \\
        --output docs/images/mlflow_rollouts.png [--run-name train] [--size 1600,1000] \\
        [--last-page]

PROJECT is a project folder with its MLflow store (``mlflow.db``, as conf/base's mlflow.yml
sets it). The newest run named ``--run-name`` is opened on its artifact ``--artifact`` (a
table logged with ``mlflow.log_table`` shows as a table). MLflow's own server serves the UI
on 127.0.0.1 from the project folder, so the runs' local artifact paths resolve; Chromium
reaches nothing else. Needs Chromium (``apt-get install chromium``; or set CHROMIUM).

Chromium is driven through its DevTools protocol (aiohttp's websocket client, which MLflow
already depends on), not ``--screenshot``: a table's last page and a closed side panel take
clicks, which only a page that can be scripted allows.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Chromium on a machine without network or screen: no sandbox (root), no GPU, nothing
# fetched in the background, a fresh profile.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")
# MLflow 3.17's UI (its du-bois design system): the table's page buttons, and the button that
# closes the assistant panel, which otherwise takes a third of the picture.
PAGES = 'li[class*="pagination-item"]'
CLOSE_ASSISTANT = ("[...document.querySelectorAll('button[aria-label=\"Close\"]')].filter(b => "
                   "b.parentElement.querySelector('button[aria-label=\"New Chat\"]'))"
                   ".forEach(b => b.click())")


async def capture(debug_port: int, url: str, size: tuple[int, int], last_page: bool,
                  wait_s: float) -> bytes:
    """Open ``url`` in the Chromium listening on ``debug_port``; the page as PNG bytes."""
    import aiohttp

    with urllib.request.urlopen(f"http://{HOST}:{debug_port}/json/list") as answer:
        (page,) = [t for t in json.load(answer) if t["type"] == "page"]
    async with aiohttp.ClientSession() as session, \
            session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
        ids = iter(range(1, 1_000_000))

        async def call(method: str, **params) -> dict:
            sent = next(ids)
            await ws.send_json({"id": sent, "method": method, "params": params})
            async for message in ws:
                reply = json.loads(message.data)
                if reply.get("id") == sent:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            raise RuntimeError("Chromium closed the connection")

        async def evaluate(expression: str):
            result = await call("Runtime.evaluate", expression=expression, returnByValue=True)
            return result["result"].get("value")

        await call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1],
                   deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", url=url)
        deadline = time.monotonic() + wait_s
        while not await evaluate(f"document.querySelectorAll('{PAGES}').length "
                                 "|| document.querySelectorAll('table, [role=table]').length"):
            if time.monotonic() > deadline:
                sys.exit(f"mlflow_png: nothing like a table on {url} after {wait_s:.0f} s")
            await asyncio.sleep(0.5)
        await evaluate(CLOSE_ASSISTANT)
        if last_page:
            await evaluate(f"[...document.querySelectorAll('{PAGES}')].at(-1)?.click()")
        await asyncio.sleep(2)  # the table re-renders
        shot = await call("Page.captureScreenshot", format="png")
    return base64.b64decode(shot["data"])


def browser() -> str:
    for name in ([os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else BROWSERS):
        if path := shutil.which(name):
            return path
    sys.exit("mlflow_png: no Chromium found (apt-get install chromium, or set CHROMIUM)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for(url: str, what: str, seconds: float = 60) -> None:
    """Until ``url`` answers, or exit naming ``what`` did not start."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"mlflow_png: {what} did not start within {seconds:.0f} s")
            time.sleep(0.5)


def newest_run(project: Path, run_name: str) -> tuple[str, str]:
    """(experiment id, run id) of the newest run called ``run_name``."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, f"attributes.run_name = '{run_name}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        sys.exit(f"mlflow_png: no run named {run_name!r} in {project / 'mlflow.db'}")
    return runs[0].info.experiment_id, runs[0].info.run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project", type=Path)
    parser.add_argument("--artifact", required=True, help="the artifact to open")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--run-name", default="train")
    parser.add_argument("--size", default="1600,1000", help="window width,height")
    parser.add_argument("--wait-s", type=float, default=60,
                        help="how long the page may take to show the table")
    parser.add_argument("--last-page", action="store_true",
                        help="turn the table to its last page (a run's last steps)")
    args = parser.parse_args()
    project = args.project.resolve()
    experiment, run = newest_run(project, args.run_name)
    port = free_port()
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    server = subprocess.Popen([str(mlflow_bin), "server", "--host", HOST, "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{project / 'mlflow.db'}",
                               "--workers", "1"], cwd=project, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        base = f"http://{HOST}:{port}"
        wait_for(f"{base}/health", "MLflow's server")  # it imports MLflow first
        url = f"{base}/#/experiments/{experiment}/runs/{run}/artifacts/{args.artifact}"
        width, height = (int(v) for v in args.size.split(","))
        debug_port = free_port()
        with tempfile.TemporaryDirectory() as profile:
            chromium = subprocess.Popen(
                [browser(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                 f"--remote-debugging-port={debug_port}", "about:blank"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_for(f"http://{HOST}:{debug_port}/json/version", "Chromium")
                png = asyncio.run(capture(debug_port, url, (width, height), args.last_page,
                                          args.wait_s))
            finally:
                chromium.terminate()
                chromium.wait(timeout=30)
        from rl_pipeline.runs.staging import staged

        with staged(args.output) as staging:
            staging.write_bytes(png)
        print(f"{url} -> {args.output}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
