"""Look at a sweep in the MLflow UI the way its users do, in a real browser, and keep the
screenshots.

    python scripts/mlflow_ui_screenshots.py runs/multirun/<time> --out results/mlflow_ui

starts `mlflow ui` on 127.0.0.1 (a free port) over the sweep's store (`<sweep>/../mlruns/mlflow.db`,
or `--tracking-uri`), finds the experiment, the sweep's parent run and one child run through the
server's own REST API, loads each page in headless Chromium (Debian's `chromium` package, driven
over its DevTools protocol) until the page shows what it should (the parent's name, the winner
sentence, the child's name), and saves `<out>/experiment.png`, `parent_run.png`, `child_run.png`,
`compare_children.png` (MLflow's compare view of the children) with `<out>/pages.json` (URLs, what
was waited for, seconds). The server and the browser are always stopped; nothing leaves the loopback
interface (the browser resolves no other host, the server's telemetry is off).

Why a script and not a test: CI has no browser. tests/test_mlflow_ui.py checks the same through the
server's HTTP answers; `ui_server` and `rest` here are what it uses.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlexp.tracking.mlflow_tracker import UI_VIEW

LOOPBACK = "127.0.0.1"
# The server's own telemetry and the browser's background traffic would leave the machine.
QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-sync",
    "--disable-extensions",
    "--disable-component-update",
    "--disable-dev-shm-usage",
    "--metrics-recording-only",
    f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {LOOPBACK}",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


@contextlib.contextmanager
def ui_server(tracking_uri: str, port: int | None = None, start_timeout_s: float = 240.0,
              log_path: Path | None = None) -> Iterator[str]:
    """`mlflow ui` over `tracking_uri` on 127.0.0.1; yields its base URL once /health answers.
    Stopped on exit (its whole process group: uvicorn's workers too), also when the start times out
    or the body raises."""
    port = port or free_port()
    log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            tracking_uri,
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **QUIET_ENV},
        start_new_session=True,
    )
    base = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow ui exited with {proc.returncode} before answering"
                                   + (f"; its log: {log_path}" if log_path else ""))
            with contextlib.suppress(OSError):
                if _get(f"{base}/health", timeout=2.0).strip() == b"OK":
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"mlflow ui did not answer {base}/health within {start_timeout_s:.0f} s"
                )
            time.sleep(0.5)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def rest(
    base: str, endpoint: str, body: dict[str, Any] | None = None, **query: str
) -> dict[str, Any]:
    """One MLflow REST call (`experiments/get-by-name`, `runs/search`, ...): GET with `query`, POST
    with `body`."""
    url = f"{base}/api/2.0/mlflow/{endpoint}" + (
        f"?{urllib.parse.urlencode(query)}" if query else ""
    )
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t.get("value", "") for t in run.get("data", {}).get("tags", [])}


def sweep_runs(
    base: str, experiment: str
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(experiment, parent run, child runs) as the server answers them."""
    exp = rest(base, "experiments/get-by-name", experiment_name=experiment)["experiment"]
    runs = rest(
        base, "runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000}
    ).get("runs", [])
    parents = [r for r in runs if tags(r).get("rlexp.role") == "parent"]
    if not parents:
        raise ValueError(
            f"experiment {experiment!r} has no sweep parent run (tag rlexp.role=parent)"
        )
    parent = parents[-1]
    children = [r for r in runs if tags(r).get("mlflow.parentRunId") == parent["info"]["run_id"]]
    return exp, parent, children


class Browser:
    """Headless Chromium over the DevTools protocol: load a page, wait for a text, take a
    screenshot."""

    def __init__(self, width: int = 1600, height: int = 1000) -> None:
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            raise SystemExit(
                "no chromium here: `apt-get update && apt-get install -y chromium` (Debian's "
                "package)"
            )
        self.profile = tempfile.mkdtemp(prefix="rlexp-chromium-")
        self.proc = subprocess.Popen(
            [
                exe,
                *CHROMIUM_FLAGS,
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port within 60 s")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        pages = [
            t
            for t in json.loads(_get(f"http://{LOOPBACK}:{port}/json/list"))
            if t.get("type") == "page"
        ]
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=None,
                                                    open_timeout=30))
        self._id = 0
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:  # events in between are not answers
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def text(self) -> str:
        res = self.call(
            "Runtime.evaluate",
            expression="document.body ? document.body.innerText : ''",
            returnByValue=True,
        )
        return str(res.get("result", {}).get("value", ""))

    def shoot(
        self, url: str, wait_for: str, path: Path, timeout_s: float = 120.0, settle_s: float = 3.0
    ) -> float:
        """Load `url`, wait until the page's text contains `wait_for` (bounded), save a PNG; seconds
        taken."""
        t0 = time.monotonic()
        self.call("Page.navigate", url=url)
        while wait_for not in self.text():
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(
                    f"{url} did not show {wait_for!r} within {timeout_s:.0f} s; it shows: "
                    f"{self.text()[:300]!r}"
                )
            time.sleep(1.0)
        time.sleep(settle_s)  # charts and tables finish drawing after their text is in
        png = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        return time.monotonic() - t0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=15)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.profile, ignore_errors=True)


def store_of(sweep_dir: Path) -> str:
    """The default store of a sweep (rlexp.tracking.mlflow_tracker):
    `<sweep>/../mlruns/mlflow.db`."""
    db = sweep_dir.resolve().parent / "mlruns" / "mlflow.db"
    if not db.is_file():
        raise SystemExit(f"no MLflow store at {db}: pass --tracking-uri sqlite:///PATH")
    return f"sqlite:///{db}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path, help="the sweep folder (runs/multirun/<time>)")
    ap.add_argument(
        "--tracking-uri", default=None, help="store URI (default: the sweep's own SQLite store)"
    )
    ap.add_argument("--experiment", default="rlexp")
    ap.add_argument("--out", type=Path, default=Path("results/mlflow_ui"))
    ap.add_argument(
        "--timeout", type=float, default=180.0, help="seconds per page and for the server start"
    )
    args = ap.parse_args(argv)
    uri = args.tracking_uri or store_of(args.sweep_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with ui_server(uri, start_timeout_s=args.timeout, log_path=args.out / "server.log") as base:
        started = time.monotonic() - t0
        exp, parent, children = sweep_runs(base, args.experiment)
        if not children:
            raise SystemExit("the parent run has no children")
        eid = exp["experiment_id"]
        child = children[0]
        winner = tags(parent).get("mlflow.note.content", "").split("\n", 1)[0]
        # A fresh browser without the view query opens MLflow 3.17 on GenAI whatever the
        # experiment's kind tag (kept as the record of what a plain link shows); rlexp's links carry
        # UI_VIEW.
        pages = [
            ("experiment_plain_link", f"{base}/#/experiments/{eid}", "Tool calls"),
            ("experiment", f"{base}/#/experiments/{eid}{UI_VIEW}", parent["info"]["run_name"]),
            (
                "parent_run",
                f"{base}/#/experiments/{eid}/runs/{parent['info']['run_id']}{UI_VIEW}",
                winner[:60] or parent["info"]["run_name"],
            ),
            (
                "child_run",
                f"{base}/#/experiments/{eid}/runs/{child['info']['run_id']}{UI_VIEW}",
                child["info"]["run_name"],
            ),
            # MLflow's compare view of the children: its parallel-coordinates plot takes the
            # first 3 differing params and the first metric by default (what a user sees before
            # choosing)
            (
                "compare_children",
                f"{base}/#/compare-runs?runs="
                + urllib.parse.quote(json.dumps([c["info"]["run_id"] for c in children]))
                + f"&experiments={urllib.parse.quote(json.dumps([eid]))}&{UI_VIEW[1:]}",
                ".00000",
            ),
        ]  # a tick label of the drawn plot (5 decimals), not just its heading
        browser = Browser()
        record: dict[str, Any] = {
            "tracking_uri": uri,
            "server_start_s": round(started, 1),
            "pages": [],
        }
        try:
            for name, url, wait_for in pages:
                s = browser.shoot(url, wait_for, args.out / f"{name}.png", timeout_s=args.timeout)
                record["pages"].append(
                    {
                        "name": name,
                        "url": url.replace(base, ""),
                        "waited_for": wait_for,
                        "seconds": round(s, 1),
                        "png": f"{name}.png",
                    }
                )
                print(f"{name}: {url} ({s:.1f} s) -> {args.out / (name + '.png')}", flush=True)
        finally:
            browser.close()
    (args.out / "pages.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (args.out / "server.log").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
