"""Issue 20 (5, 6, 9): one real `rlexp train logger=all` run with a table of planted secrets, and every output it
writes read back: the run folder (every file: `.hydra/*`, manifest.json, train.log, metrics, git.diff), the W&B
offline run (every file, the binary `.wandb` transaction log grepped as bytes), the MLflow store (every row of
every table of mlflow.db through sqlite3, the raw database bytes, the artifacts folder), the launch directory and
the console. W&B runs offline with a (fake) WANDB_API_KEY set, against a local listener standing in for the W&B
server and for any HTTP(S) proxy: the run must make no connection at all.

Every planted value holds a marker made at run time (never spelt out in this file), so a copy of this test in
the checkout's git diff cannot be mistaken for a leak.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rlexp.tracking.redact import REDACTED
from tests.conftest import REPO, NetListener, kill_tagged, tagged_env, wait_no_orphans

pytestmark = pytest.mark.slow  # one real `rlexp train` run (about a minute on CPU)

M = "Q" + uuid.uuid4().hex[:6].upper()  # the marker: upper-case hex, fits every token alphabet below


def _n(i: int) -> str:
    """The needle of planted secret i: unique, and no needle is a prefix of another."""
    return f"{M}N{i:02d}X"


# `+extra.<name>=<value>`: the value is a secret because of the key's name (the value itself has no shape).
SECRET_NAMES = ["pwd", "pass", "db_pass", "dsn", "connection_string", "webhook_url", "password", "passwd",
                "db_password", "api_key", "hf_token", "client_secret", "private_key", "access_token", "conn_str",
                "sentry_dsn", "slack_webhook", "smtp_pwd", "secret", "AccountKey"]
# `+extra.v<i>=<value>`: a harmless key, the value is a secret because of its shape (needle index, value).
SHAPES = {
    "postgres URL userinfo": (30, lambda n: f"postgres://admin:{n}@db.example.com:5432/app"),
    "https URL userinfo": (31, lambda n: f"https://user:{n}@mirror.example.com/simple"),
    "Slack webhook URL": (32, lambda n: f"https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/{n}abcdef0123"),
    "Discord webhook URL": (33, lambda n: f"https://discord.com/api/webhooks/123456789012345678/{n}abc-def_0123"),
    "AWS access key id": (34, lambda n: f"AKIA{n}{'Z' * (16 - len(n))}"),
    "GitHub ghp_ token": (35, lambda n: f"ghp_{n}{'a1' * 14}"),
    "GitHub fine-grained PAT": (36, lambda n: f"github_pat_11ABCDEFG0{n}_{'b2' * 25}"),
    "Hugging Face token": (37, lambda n: f"hf_{n}{'c3' * 12}"),
    "OpenAI key": (38, lambda n: f"sk-proj-{n}{'d4' * 12}"),
    "Anthropic key": (39, lambda n: f"sk-ant-api03-{n}{'e5' * 20}"),
    "JWT": (40, lambda n: f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.{n}sig_nature"),
    "PEM private key": (41, lambda n: f"'-----BEGIN PRIVATE KEY----- MIIEvQIBADANBgkq{n}hkiG9w0B "
                                      "-----END PRIVATE KEY-----'"),
    "password= in a string": (42, lambda n: f"'host=db.example.com user=app password={n} sslmode=require'"),
    "Bearer header": (43, lambda n: f"'Authorization: Bearer {n}abcdef0123456789'"),
    "Google API key": (44, lambda n: f"AIza{n}{'f' * (35 - len(n))}"),
    "Slack bot token": (45, lambda n: f"xoxb-123456789012-{n}slack"),
    "Azure connection string": (46, lambda n: f"'DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={n}==;"
                                             f"EndpointSuffix=core.windows.net'"),
    "Stripe live key": (47, lambda n: f"sk_live_{n}{'g' * 12}"),
    "token in a URL query": (48, lambda n: f"'https://api.example.com/v1?access_token={n}&page=2'"),
}
# Legitimate keys that only look alike: kept as they are.
HARMLESS = {"max_tokens": "64", "n_passes": "3", "bypass_cache": "true", "dsn_count": "2", "compass": "north",
            "password_min_len": "12", "pass_at_k": "4", "tokenizer": "char", "passes": "2", "token_budget": "100"}
WANDB_FAKE_KEY = uuid.uuid4().hex + uuid.uuid4().hex[:8]  # 40 hex, the shape of a real W&B key


def _grep_files(root: Path, needles: dict[str, str], label, hits: dict[str, set[str]]) -> None:
    if not root.exists():
        return
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            for what, n in needles.items():
                if n.encode() in data:
                    hits[what].add(label(p))


def _db_rows(db: Path) -> str:
    """Every row of every table of the MLflow store, as text (what `mlflow ui` or any reader of the file sees)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        out = []
        for (table,) in con.execute("select name from sqlite_master where type = 'table'"):
            for row in con.execute(f'select * from "{table}"'):
                out.append(f"{table}: " + " | ".join(map(str, row)))
        return "\n".join(out)
    finally:
        con.close()


def test_planted_secrets_reach_no_output_of_a_real_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from rlexp.tracking.runs import load_wandb_dir

    run, store, work, home = tmp_path / "run", tmp_path / "store", tmp_path / "work", tmp_path / "wandb_home"
    work.mkdir()
    needles: dict[str, str] = {}
    # 4 eval problems: the eval outputs are still written (the secrets are in the config)
    args = ["train", "logger=all", "steps=2", "eval.every_n_steps=2", "eval.max_samples=4",
            "algorithm.prompts_per_step=4", f"hydra.run.dir={run}",
            "logger.mlflow.experiment=secrets"]
    for i, name in enumerate(SECRET_NAMES):
        needles[f"name {name}"] = _n(i)
        args.append(f"+extra.{name}={_n(i)}")
    for what, (i, make) in SHAPES.items():
        needles[f"shape {what}"] = _n(i)
        args.append(f"+extra.v{i}={make(_n(i))}")
    args += [f"+extra.{k}={v}" for k, v in HARMLESS.items()]
    needles["env WANDB_API_KEY (fake)"] = WANDB_FAKE_KEY
    needles["env HF_TOKEN"] = _n(60)
    needles["env RLEXP_DB_PASS"] = _n(61)

    net = NetListener()
    tag = uuid.uuid4().hex
    env = tagged_env(tag)
    env.update({
        "WANDB_MODE": "offline", "WANDB_API_KEY": WANDB_FAKE_KEY, "WANDB_SILENT": "true",
        "WANDB_BASE_URL": f"http://127.0.0.1:{net.port}",
        "HF_TOKEN": f"hf_{_n(60)}{'h7' * 12}", "RLEXP_DB_PASS": _n(61),
        "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}",  # no artifact location given: beside the store
    })
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env[var] = f"http://127.0.0.1:{net.port}"
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        env[var] = str(home / var.lower())
    env["HOME"] = str(tmp_path / "home")  # ~/.netrc, ~/.config/wandb: nothing to read, nothing left behind
    store.mkdir()
    try:
        p = subprocess.run([sys.executable, "-m", "rlexp", *args], cwd=work, env={**env, "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True, timeout=600)
    finally:
        net.close()
        kill_tagged(tag) if wait_no_orphans(tag, timeout=20) else None
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]

    # ---- where each planted secret was found (the table is the failure message)
    hits: dict[str, set[str]] = {w: set() for w in needles}
    in_run = {".hydra", "wandb"}
    _grep_files(run, needles, lambda q: (q.relative_to(run).parts[0] if q.relative_to(run).parts[0] in in_run
                                         else q.relative_to(run).as_posix()) if not q.name.endswith(".wandb")
                else "wandb/*.wandb (binary)", hits)
    _grep_files(home, needles, lambda q: "wandb cache/config dirs", hits)
    _grep_files(work, needles, lambda q: f"cwd/{q.relative_to(work).as_posix()}", hits)
    _grep_files(store / "artifacts", needles, lambda q: "mlflow artifacts", hits)
    rows = _db_rows(store / "mlflow.db")
    for what, n in needles.items():
        if n in rows:
            hits[what].add("mlflow.db rows")
        if any(n.encode() in f.read_bytes() for f in store.glob("mlflow.db*")):
            hits[what].add("mlflow.db bytes")
        if n in p.stdout or n in p.stderr:
            hits[what].add("console")
    leaks = {w: sorted(h) for w, h in hits.items() if h}
    assert leaks == {}, "planted secrets found:\n" + "\n".join(f"  {w}: {', '.join(h)}" for w, h in leaks.items())

    # ---- offline, although a key was set: no connection, an offline run folder, nothing written to cwd
    assert net.seen == [], f"the run tried the network: {net.seen}"
    m = json.loads((run / "manifest.json").read_text())
    assert m["trackers"]["wandb"]["mode"] == "offline" and m["env"]["WANDB_API_KEY"] == REDACTED
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert not [d for d in (run / "wandb").iterdir() if d.name.startswith("run-")]  # no online run folder
    assert sorted(x.name for x in work.iterdir()) == [], "written to the launch directory"
    assert (store / "artifacts").is_dir()

    # ---- the planted keys are there, redacted; the look-alikes are kept as they were
    x = m["config"]["extra"]
    assert all(x[name] == REDACTED for name in SECRET_NAMES), {k: x[k] for k in SECRET_NAMES}
    for k, v in HARMLESS.items():
        assert str(x[k]).lower() == v, (k, x[k])
    assert REDACTED in x["v30"] and "db.example.com" in x["v30"]  # the host stays readable
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    (r,) = client.search_runs([client.get_experiment_by_name("secrets").experiment_id])
    assert r.info.artifact_uri.startswith((store / "artifacts").as_uri())
    assert r.data.params["extra.pwd"] == REDACTED and r.data.params["extra.dsn_count"] == "2"
    assert r.data.params["extra.password_min_len"] == "12" and r.data.params["extra.n_passes"] == "3"
    (rec,) = load_wandb_dir(run / "wandb")
    assert rec.config["extra.webhook_url"] == REDACTED and rec.config["extra.bypass_cache"] is True
