"""Secrets never reach the disk copies or the trackers: redaction by name and by value.

Planted: plural/common secret names, URL userinfo in a tracking-URI-like value, token shapes (Bearer, hf_, sk-,
ghp_, xoxb-, AKIA, JWT, a W&B 40-hex key behind WANDB_API_KEY=) under innocent keys, secret overrides on the
command line, env vars, an untracked `.env` in the code checkout. Checked: manifest.json, git.diff, the `.hydra/`
copies and multirun.yaml, the MLflow run (params, tags, artifacts, read back with MlflowClient from a local
SQLite store) and the W&B offline run folder (every file, the transaction log included). Real Hydra app in a
subprocess, real MLflow store, real W&B offline: no mocks, no network.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.tracking.hydra_run import redact_yaml_file
from rlexp.tracking.manifest import Manifest, read_manifest, write_start_manifest
from rlexp.tracking.redact import REDACTED, is_secret_name, redact, redact_argv, redact_override, redact_text
from rlexp.tracking.runconfig import config_to_container

REPO = Path(__file__).resolve().parents[1]
MARK = "PLANTED7"  # every planted secret contains it (but the hex key): grep for it in every file
WANDB_HEX = "0123456789abcdef0123456789abcdef0badc0de"
COMMIT_HEX = "fedcba9876543210fedcba9876543210deadbeef"  # same shape, harmless name: kept


# --------------------------------------------------------------------------------------------- by name
SECRET_NAMES = [
    "api_key", "WANDB_API_KEY", "hfToken", "HF_TOKEN", "client-secret", "db_password", "apikey", "token",
    "api_keys", "apiKeys", "hf_tokens", "HF_TOKENS", "authorization", "Authorization", "bearer", "passphrase",
    "cookie", "cookies", "session", "session_id", "credential", "credentials", "private_key", "client_secret",
    "access_key", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "reward.hf_token",
    "+logger.wandb.api_key", "--api-key", "github_tokens", "secrets", "passwords",
    # issue 20: short and compound credential names
    "pwd", "x.pwd", "smtp_pwd", "pass", "db_pass", "RLEXP_DB_PASS", "dsn", "sentry_dsn", "SENTRY_DSN",
    "connection_string", "conn_str", "connStr", "DATABASE_URL", "db_uri", "webhook_url", "slack_webhook",
    "webhooks", "AccountKey", "password_hash", "client_secret_id",
]
HARMLESS_NAMES = [
    "max_tokens", "tokenizer", "token_ids", "n_tokens", "kv_cache_gb", "max_num_batched_tokens",
    "max_prompt_tokens", "num_keys_total", "n_kv_heads", "seed", "kl_coef", "eos_token", "pad_token_id",
    "stop_tokens", "special_tokens", "sort_key", "tokens", "keys", "TOKENIZERS_PARALLELISM", "tracking_uri",
    "token_budget", "tokens_per_step", "auth_type", "session_dir", "hf_repo",
    # issue 20: look-alikes of the short names (segments, not substrings), and names that describe a credential
    "n_passes", "passes", "bypass_cache", "compass", "pass_at_k", "pass_rate", "dsn_count", "password_min_len",
    "password_file", "secret_name", "hf_token_env", "PWD", "OLDPWD", "webhook_enabled", "connection_timeout",
    "max_connections", "tracking_uri", "db_name",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_harmless_names(name: str) -> None:
    assert not is_secret_name(name)


# issue 41: a table of secret-like words and innocent look-alikes, each in every name style a config, an
# override, a flag or an environment variable spells it. Short words (`pat`, `otp`, `sas`, `sig`) are secrets as
# the name's last segment; numbered, only the long ones are (`api_key_2`), because `pass@1` is a metric.
SECRET_WORDS = ["pat", "otp", "totp", "sas", "sig", "sas_sig", "sas_token", "sas_signature", "sas_url",
                "client_secret", "private_key", "refresh_token", "session", "cookie", "api_key", "passcode",
                "mfa_code", "otp_code", "github_pat", "access_token", "signing_key"]
LONG_SECRET_WORDS = [w for w in SECRET_WORDS if w.split("_")[-1] not in ("pat", "otp", "totp", "sas", "sig")]
# `signature` stays: a DSPy program's `signature` is its task spec and `signature_dim` a size; only a signature
# that signs a request (`sas_signature`, `SharedAccessSignature`) is a credential.
INNOCENT_WORDS = ["max_tokens", "n_passes", "pattern", "signature_dim", "signature", "path", "patience", "sigma",
                  "session_dir", "token_ids", "sas_count", "otp_enabled", "pat_file", "num_keys", "eos_token",
                  "spatial_size", "compass", "max_num_batched_tokens"]


def name_styles(word: str, numbered: bool = True) -> list[str]:
    """snake, camel, kebab, upper, a config path, an override with prefixes, a flag, an env var (, numbered)."""
    parts = word.split("_")
    camel = parts[0] + "".join(p.capitalize() for p in parts[1:])
    styles = [word, camel, camel[0].upper() + camel[1:], "-".join(parts), word.upper(), f"extra.{word}",
              f"+extra.{word}", f"++logger.wandb.{camel}", f"~extra.{word}", f"--{'-'.join(parts)}",
              f"RLEXP_{word.upper()}", f"my_service_{word}"]
    return styles + ([f"{word}_2", f"{camel}2"] if numbered else [])


GENERATED_SECRETS = sorted({n for w in SECRET_WORDS for n in name_styles(w, w in LONG_SECRET_WORDS)})
GENERATED_INNOCENT = sorted({n for w in INNOCENT_WORDS for n in name_styles(w)})


@pytest.mark.parametrize("name", GENERATED_SECRETS)
def test_generated_secret_names(name: str) -> None:
    assert is_secret_name(name)
    if not name.startswith("-"):
        assert redact_override(f"{name}=v4lue") == f"{name}={REDACTED}"


@pytest.mark.parametrize("name", GENERATED_INNOCENT)
def test_generated_innocent_names(name: str) -> None:
    assert not is_secret_name(name)
    if not name.startswith("-"):
        assert redact_override(f"{name}=v4lue") == f"{name}=v4lue"


def test_numbered_short_words_and_metrics() -> None:
    assert not is_secret_name("eval/pass@1") and not is_secret_name("pass_at_1") and is_secret_name("db_pass")
    assert redact({"eval/pass@1": 0.5, "extra": {"pat": "x", "sas_sig": "y"}}) == {
        "eval/pass@1": 0.5, "extra": {"pat": REDACTED, "sas_sig": REDACTED}}


def test_redact_by_name_keeps_non_credentials() -> None:
    tree = {"api_keys": ["a", "b"], "hf_tokens": {"main": "x"}, "use_auth_token": True, "api_key": None,
            "password": "", "max_tokens": 64, "token_ids": [1, 2], "cookie": "c"}
    assert redact(tree) == {"api_keys": REDACTED, "hf_tokens": REDACTED, "use_auth_token": True, "api_key": None,
                            "password": "", "max_tokens": 64, "token_ids": [1, 2], "cookie": REDACTED}
    assert redact(redact(tree)) == redact(tree)  # idempotent


# --------------------------------------------------------------------------------------------- by value
TOKENS = {
    "https://user:pass@host/x": "https://***REDACTED***@host/x",
    "postgresql://u:p@db.example.com:5432/mlflow": "postgresql://***REDACTED***@db.example.com:5432/mlflow",
    "https://ghp_abc@github.com/org/repo.git": "https://***REDACTED***@github.com/org/repo.git",
    "Authorization: Bearer abcdef0123456789abcdef": "Authorization: Bearer ***REDACTED***",
    "Bearer abcdef0123456789abcdef": "Bearer ***REDACTED***",
    "Authorization: Basic dXNlcjpwYXNz": "Authorization: Basic ***REDACTED***",
    "token hf_abcdefghijklmnopqrstuvwxyz0123456789 end": "token ***REDACTED*** end",
    "sk-proj-abc123def456ghi789jkl012": REDACTED,
    "ghp_" + "a1" * 18: REDACTED,
    "github_pat_" + "A1b2" * 12: REDACTED,
    "xoxb-123456789012-abcdefABCDEF": REDACTED,
    "AKIAABCDEFGHIJ234567": REDACTED,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig_nature-1": REDACTED,
    f"WANDB_API_KEY={WANDB_HEX} rlexp train": "WANDB_API_KEY=***REDACTED*** rlexp train",
    f'{{"api_key": "{WANDB_HEX}", "n": 1}}': '{"api_key": "***REDACTED***", "n": 1}',
    "https://h/p?token=abc&x=1": "https://h/p?token=***REDACTED***&x=1",
    "curl --api-key abc https://x": "curl --api-key ***REDACTED*** https://x",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----": REDACTED,
    # as Hydra records overrides (escaped) in .hydra/overrides.yaml, hydra.yaml and job.override_dirname
    "+misc.mirror=https\\://mirror\\:pw@host/x": "+misc.mirror=https\\://***REDACTED***@host/x",
    "+x.header=Authorization\\: Bearer\\ abc0123456789abcdef": "+x.header=Authorization\\: Bearer\\ ***REDACTED***",
    "seed=0,+service.hf_token=abc,trainer.lr=0.1": "seed=0,+service.hf_token=***REDACTED***,trainer.lr=0.1",
    "x.api_key=pass\\=word\\,more": "x.api_key=***REDACTED***",
    # issue 20: more shapes
    "postgres://user:pw@db:5432/app": "postgres://***REDACTED***@db:5432/app",
    "https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/abcDEF0123": "https://hooks.slack.com/services/***REDACTED***",
    "https://discord.com/api/webhooks/123456789012345678/abc-DEF_0123 x":
        "https://discord.com/api/webhooks/***REDACTED*** x",
    "https://acme.webhook.office.com/webhookb2/abc@def/IncomingWebhook/x":
        "https://acme.webhook.office.com/webhookb2/***REDACTED***",
    "sk-ant-api03-" + "e5" * 20: REDACTED,
    "-----BEGIN PRIVATE KEY----- MIIEvQIBADANBg kqhkiG9w0B -----END PRIVATE KEY-----": REDACTED,
    "key: -----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEA\\nAAAA": "key: ***REDACTED***",
    "host=db user=app password=hunter2 sslmode=require": "host=db user=app password=***REDACTED*** sslmode=require",
    "AccountName=acct;AccountKey=abc/def+g==;EndpointSuffix=core.windows.net":
        "AccountName=acct;AccountKey=***REDACTED***;EndpointSuffix=core.windows.net",
    "DATABASE_URL=mysql://u:p@h/db": "DATABASE_URL=***REDACTED***",
    "ya29.a0AfH6SMBx1234567890abcdefghij": REDACTED,
    "npm_" + "A1" * 18: REDACTED,
    # issue 41: an Azure SAS query string (only its signature is the secret), a Slack app-level token
    "https://a.blob.core.windows.net/c/b?sv=2022-11-02&se=2026-01-01&sr=b&sp=r&sig=abcDEF%2B123%3D":
        "https://a.blob.core.windows.net/c/b?sv=2022-11-02&se=2026-01-01&sr=b&sp=r&sig=***REDACTED***",
    "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessSignature=sr%3Dx%26sig%3Dab":
        "Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessSignature=***REDACTED***",
    "xapp-1-A0123456789-0123456789012-abcdef0123456789": REDACTED,
    "gho_" + "B2" * 18: REDACTED,
}
UNTOUCHED = [
    "model=tiny trainer.lr=3e-4", "sqlite:////tmp/x/mlflow.db", "file:///tmp/artifacts", "Qwen/Qwen3-8B",
    WANDB_HEX,  # a bare 40-hex string is a git commit as often as a W&B key: only behind a key-ish name
    "/opt/sk-learn-models-abcdefghijklmnop", "e.g. algorithm.group_size=8 trainer.lr=3e-4", "runs/${now:%H-%M-%S}",
    "bearer credentials are checked", "user@example.com", "max_tokens=64 tokenizer=char",
    "hydra.job.env_set.HF_TOKEN=${oc.env:HF_TOKEN}",
]


@pytest.mark.parametrize("raw", list(TOKENS))
def test_token_shapes_are_redacted(raw: str) -> None:
    assert redact_text(raw) == TOKENS[raw]
    assert redact_text(TOKENS[raw]) == TOKENS[raw]


@pytest.mark.parametrize(("arg", "expected"), [
    ("+x.pwd=hunter2", f"+x.pwd={REDACTED}"),
    ("+x.note=password=hunter2", f"+x.note=password={REDACTED}"),  # the value is scanned on its own
    ("+x.dsn_count=2", "+x.dsn_count=2"),
    ("+x.password_min_len=12", "+x.password_min_len=12"),
    ("seed=0,+service.db_pass=abc,trainer.lr=0.1", f"seed=0,+service.db_pass={REDACTED},trainer.lr=0.1"),
])
def test_override_redaction(arg: str, expected: str) -> None:
    assert redact_override(arg) == expected


@pytest.mark.parametrize("raw", UNTOUCHED)
def test_ordinary_values_are_untouched(raw: str) -> None:
    assert redact_text(raw) == raw


def test_argv_redaction() -> None:
    argv = ["rlexp", "train", "+reward.hf_token=abc", "--password", "pw1", "--token=t0",
            "logger.mlflow.tracking_uri=https://u:p@h/", "seed=1"]
    assert redact_argv(argv) == ["rlexp", "train", f"+reward.hf_token={REDACTED}", "--password", REDACTED,
                                 f"--token={REDACTED}", f"logger.mlflow.tracking_uri=https://{REDACTED}@h/",
                                 "seed=1"]


def test_yaml_rewrite_keeps_types_and_interpolations(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("lr: 1.0e-05\nsteps: 3\nflag: true\napi_key: ${oc.env:WANDB_API_KEY}\nhf_token: hf_raw\n"
                 "uri: https://u:p@h/x\nother: ${lr}\nmissing: ???\n")
    assert redact_yaml_file(p)
    c = OmegaConf.load(p)
    assert OmegaConf.to_container(c, resolve=False, throw_on_missing=False) == {
        "lr": 1e-05, "steps": 3, "flag": True, "api_key": "${oc.env:WANDB_API_KEY}", "hf_token": REDACTED,
        "uri": f"https://{REDACTED}@h/x", "other": "${lr}", "missing": "???"}
    before = p.read_bytes()
    assert not redact_yaml_file(p) and p.read_bytes() == before  # nothing left: not rewritten


# --------------------------------------------------------------------------------------------- real config
def _walk(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield f"{path}.{k}" if path else str(k), k, v
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _walk(v, f"{path}[{i}]")


def test_real_config_is_not_redacted(tmp_path: Path) -> None:
    """The shipped config (conf/** and every schema field) must survive redaction unchanged, or the
    manifest loses information and config_sha256 stops seeing changes of a wrongly redacted key."""
    from hydra import compose, initialize_config_dir

    from rlexp.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        full = compose("train", return_hydra_config=True)
    hydra_node = OmegaConf.to_container(full.hydra, resolve=False, throw_on_missing=False)
    cfg = OmegaConf.masked_copy(full, [k for k in full if k != "hydra"])
    resolved = config_to_container(cfg)
    assert redact(resolved) == resolved
    assert redact({"hydra": hydra_node}) == {"hydra": hydra_node}
    # every YAML under conf, raw: keys and string values
    files = sorted(CONF_DIR.rglob("*.yaml"))
    assert len(files) > 40
    for f in files:
        raw = OmegaConf.to_container(OmegaConf.load(f), resolve=False, throw_on_missing=False)
        assert redact(raw) == raw, f
    # every field name of every schema dataclass
    names = set()
    for mod in ("rlexp.config.schema", "rlexp.config.environment", "rlexp.config.eval", "rlexp.config.model",
                "rlexp.config.reward", "rlexp.config.logger"):
        m = importlib.import_module(mod)
        for obj in vars(m).values():
            if dataclasses.is_dataclass(obj) and isinstance(obj, type):
                names |= {f.name for f in dataclasses.fields(obj)}
    assert {"max_tokens", "kv_cache_gb", "max_num_batched_tokens"} <= names
    assert [n for n in names if is_secret_name(n)] == []
    # The .hydra/ copies Hydra would write for the default run are left byte for byte as they are.
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_node}), run / ".hydra" / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(["seed=0", "model=tiny"]), run / ".hydra" / "overrides.yaml")
    before = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    m = write_start_manifest(run, cfg, ["rlexp", "train", "seed=0", "model=tiny"], {"global": 0}, {},
                             repo_dir=tmp_path).to_dict()
    assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == before
    assert m["hydra"]["redacted_files"] == []
    assert m["config"] == json.loads(json.dumps(resolved)) and REDACTED not in json.dumps(m["config"])


# --------------------------------------------------------------------------------------------- end to end
APP = textwrap.dedent('''
    import os
    import sys
    from pathlib import Path

    import hydra
    from hydra.core.hydra_config import HydraConfig

    from rlexp.tracking import build_trackers, write_start_manifest


    @hydra.main(version_base="1.3", config_path="conf", config_name="train")
    def main(cfg) -> float:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        manifest = write_start_manifest(run_dir, cfg, sys.argv, {"global": int(cfg.seed)},
                                        {"notes": {"link": os.environ["PLANTED_EXTRA"]}},
                                        repo_dir=os.environ["PLANTED_REPO"])
        with build_trackers(cfg.logger, cfg, run_dir, manifest) as tr:
            for step in range(2):
                tr.log({"reward/mean": 0.5 * step}, step)
            art = run_dir / "eval_results.json"
            art.write_text('{"accuracy": 0.5}')
            tr.log_artifact(art)
        return 0.5


    if __name__ == "__main__":
        main()
''')

TRAIN_YAML = f"""
seed: 0
service:
  api_keys: [k1-{MARK}-apikeys, k2-{MARK}-apikeys]
  hf_tokens: {{main: plain-{MARK}-hftokens}}
  authorization: "Basic {MARK}basicauth"
  bearer: {MARK}bearerword
  passphrase: {MARK}passphrase
  cookie: {MARK}cookie
  session: {MARK}session
  private_key: {MARK}privatekey
  client_secret: {MARK}clientsecret
  access_key: {MARK}accesskey
storage:
  tracking_uri: postgresql://admin:{MARK}dbpw@db.example.com:5432/mlflow
misc:
  header: "Authorization: Bearer {MARK}0123456789abcdef"
  hf: hf_{MARK}value0123456789abcdefghij
  openai: sk-proj-{MARK}0123456789abcdefgh
  github: ghp_{MARK}0123456789abcdefghijklmnopqrstuv
  slack: xoxb-123456789012-{MARK}slack
  aws: AKIA{MARK}01234567
  jwt: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.{MARK}sig
  login: "env WANDB_API_KEY={WANDB_HEX} wandb sync"
keep:
  max_tokens: 64
  tokenizer: char
  token_ids: [1, 2, 3]
  n_tokens: 5
  kv_cache_gb: 1.5
  max_num_batched_tokens: 2048
  use_auth_token: true
  commit: {COMMIT_HEX}
  url: https://huggingface.co/Qwen/Qwen3-8B
logger:  # the fields of rlexp.config.logger.LoggerConfig
  wandb: {{enabled: true, mode: auto, project: redaction-test, entity: null}}
  mlflow: {{enabled: true, tracking_uri: null, experiment: redaction-test}}
  log_every_n_steps: 1
  rollout_samples: 2
  runs_root: null
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def _files_with(root: Path, needles: list[bytes]) -> dict[str, list[str]]:
    hits: dict[str, list[str]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            found = [n.decode() for n in needles if n in data]
            if found:
                hits[str(p.relative_to(root))] = found
    return hits


def test_planted_secrets_never_reach_disk_or_trackers(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from rlexp.tracking.runs import load_wandb_dir

    app = tmp_path / "app"
    (app / "conf").mkdir(parents=True)
    (app / "conf" / "train.yaml").write_text(TRAIN_YAML)
    (app / "train_app.py").write_text(APP)
    code = tmp_path / "code"  # the checkout that "ran": a tracked change with a token, an untracked .env
    code.mkdir()
    _git(code, "init", "-q")
    (code / "train.py").write_text("lr = 1\n")
    _git(code, "add", "train.py")
    _git(code, "commit", "-q", "-m", "init")
    (code / "train.py").write_text(f'lr = 2\nTOKEN = "ghp_{MARK}diff0123456789abcdefghijklmn"\n')
    (code / ".env").write_text(f"HF_TOKEN=dotenv-{MARK}\n")
    (code / "notes.txt").write_text("untracked notes\n")

    work = tmp_path / "work"
    work.mkdir()
    sweep = tmp_path / "runs" / "sweep"
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "HYDRA_FULL_ERROR": "1", "PLANTED_REPO": str(code),
           "PLANTED_EXTRA": f"https://u:{MARK}extra@host.example.com/x",
           "HF_TOKEN": f"hf_{MARK}env0123456789abcdefghijk",
           "MLFLOW_TRACKING_URI": f"https://user:{MARK}envuri@mlflow.example.com",
           "RLEXP_NOTE": f"Bearer {MARK}envbearer0123456789"}
    env.pop("WANDB_API_KEY", None)
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        env[var] = str(tmp_path / "wandb_home" / var.lower())
    store = tmp_path / "runs" / "mlruns" / "mlflow.db"
    uri = f"sqlite:///{store.as_posix()}"
    p = subprocess.run(
        [sys.executable, str(app / "train_app.py"), "-m", f"hydra.sweep.dir={sweep}",
         f"logger.mlflow.tracking_uri={uri}",  # the real store; MLFLOW_TRACKING_URI (env) is a planted decoy
         f"+service.hf_token=hf_{MARK}cli0123456789abcdefghijk",
         f"+misc.mirror=https://mirror:{MARK}cliurl@mirror.example.com/x",
         f"+extra.pat={MARK}pat", f"+extra.otp={MARK}otp", f"+extra.sas_sig={MARK}sig"],  # issue 41
        check=False, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    run = sweep / "0"

    # ---- nothing anywhere: run folder (manifest, git.diff, .hydra/, W&B), sweep (multirun.yaml), MLflow store
    # and artifacts, W&B's own cache/config dirs. Only the app's sources and the checkout hold the secrets.
    needles = [MARK.encode(), WANDB_HEX.encode()]
    leaks = {}
    for root in (tmp_path / "runs", tmp_path / "wandb_home", work):
        leaks.update({f"{root.name}/{k}": v for k, v in _files_with(root, needles).items()})
    assert leaks == {}

    # ---- manifest: redacted where it should be, intact elsewhere
    m = read_manifest(run).to_dict()
    c = m["config"]
    assert all(c["service"][k] == REDACTED for k in c["service"]), c["service"]
    assert c["storage"]["tracking_uri"] == f"postgresql://{REDACTED}@db.example.com:5432/mlflow"
    assert c["misc"]["header"] == f"Authorization: Bearer {REDACTED}"
    for k in ("hf", "openai", "github", "slack", "aws", "jwt"):
        assert c["misc"][k] == REDACTED, k
    assert c["misc"]["login"] == f"env WANDB_API_KEY={REDACTED} wandb sync"
    assert c["misc"]["mirror"] == f"https://{REDACTED}@mirror.example.com/x"
    assert c["keep"] == {"max_tokens": 64, "tokenizer": "char", "token_ids": [1, 2, 3], "n_tokens": 5,
                         "kv_cache_gb": 1.5, "max_num_batched_tokens": 2048, "use_auth_token": True,
                         "commit": COMMIT_HEX, "url": "https://huggingface.co/Qwen/Qwen3-8B"}
    assert c["logger"]["mlflow"]["tracking_uri"] == uri  # nothing secret in it: kept
    assert f"+service.hf_token={REDACTED}" in m["overrides"]
    assert f"+misc.mirror=https\\://{REDACTED}@mirror.example.com/x" in m["overrides"]  # as Hydra escapes it
    assert f"+service.hf_token={REDACTED}" in m["argv"] and REDACTED in m["command"]
    assert m["env"]["HF_TOKEN"] == REDACTED
    assert m["env"]["MLFLOW_TRACKING_URI"] == f"https://{REDACTED}@mlflow.example.com"
    assert m["env"]["RLEXP_NOTE"] == f"Bearer {REDACTED}"
    assert m["notes"]["link"] == f"https://{REDACTED}@host.example.com/x"
    # git: tracked diff only (token on the added line redacted), untracked files by name
    g = m["git"]
    assert sorted(g["untracked"]) == [".env", "notes.txt"] and g["diff_redacted"] == 1
    diff = (run / "git.diff").read_text()
    assert "+lr = 2" in diff and f'TOKEN = "{REDACTED}"' in diff and ".env" not in diff and "notes" not in diff

    # ---- the .hydra/ copies and the sweep's multirun.yaml were rewritten redacted (and still load)
    assert sorted(Path(f).name for f in m["hydra"]["redacted_files"]) == [
        "config.yaml", "hydra.yaml", "multirun.yaml", "overrides.yaml"]
    hc = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert hc.service.api_keys == REDACTED and hc.service.hf_token == REDACTED and hc.keep.max_tokens == 64
    assert hc.storage.tracking_uri == f"postgresql://{REDACTED}@db.example.com:5432/mlflow"
    assert f"+service.hf_token={REDACTED}" in list(OmegaConf.load(run / ".hydra" / "overrides.yaml"))
    hy = OmegaConf.load(run / ".hydra" / "hydra.yaml")
    assert f"+service.hf_token={REDACTED}" in list(hy.hydra.overrides.task)
    assert OmegaConf.load(sweep / "multirun.yaml").service.cookie == REDACTED

    # ---- MLflow, read back with its own client
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("redaction-test")
    (r,) = client.search_runs([exp.experiment_id], filter_string="tags.`rlexp.role` = 'child'")
    params, tags = r.data.params, r.data.tags
    assert params["service.api_keys"] == REDACTED and params["service.hf_token"] == REDACTED
    assert params["misc.github"] == REDACTED and params["keep.max_tokens"] == "64"
    assert params["keep.commit"] == COMMIT_HEX
    assert params["storage.tracking_uri"] == f"postgresql://{REDACTED}@db.example.com:5432/mlflow"
    assert REDACTED in tags["rlexp.overrides"]
    for k, v in {**params, **tags}.items():
        assert MARK not in v and WANDB_HEX not in v, k
    arts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {"manifest.json", "git.diff", "eval_results.json"} <= arts
    for name in ("manifest.json", "git.diff"):
        local = Path(client.download_artifacts(r.info.run_id, name, str(tmp_path / "dl")))
        assert MARK not in local.read_text(), name

    # ---- W&B offline run: config read back, and every file of the run grepped above
    (offline,) = list((run / "wandb").glob("offline-run-*"))
    assert list(offline.glob("run-*.wandb"))
    (rec,) = load_wandb_dir(run / "wandb")
    assert rec.config["service.api_keys"] == REDACTED and rec.config["keep.max_tokens"] == 64
    assert rec.config["misc.mirror"] == f"https://{REDACTED}@mirror.example.com/x"
    wb_log = b"".join(f.read_bytes() for f in offline.rglob("*") if f.is_file())
    assert f"+service.hf_token={REDACTED}".encode() in wb_log  # W&B's args metadata: the redacted argv


def test_trackers_redact_a_raw_manifest_and_argv(tmp_path: Path, monkeypatch, offline_trackers: None) -> None:
    """Belt and braces: a tracker handed an unredacted manifest (built by hand, not by write_start_manifest) and
    a secret on sys.argv still uploads nothing secret."""
    from mlflow.tracking import MlflowClient

    from rlexp.tracking.registry import build_trackers
    from tests.mlflow_store import fresh_store

    monkeypatch.setattr(sys, "argv", ["rlexp", "train", f"+reward.api_keys=[{MARK}argv]"])
    run = tmp_path / "runs" / "raw"
    uri = f"sqlite:///{fresh_store(tmp_path / 'mlflow.db').as_posix()}"  # empty, no migrations
    cfg = OmegaConf.create({
        "seed": 1, "reward": {"hf_tokens": [f"{MARK}a"], "url": f"https://u:{MARK}b@h/x"},
        "logger": {"wandb": {"enabled": True, "mode": "auto", "project": "raw", "entity": None},
                   "mlflow": {"enabled": True, "tracking_uri": uri, "experiment": "raw"}}})
    manifest = Manifest.from_dict({
        "config": OmegaConf.to_container(cfg), "overrides": [f"+reward.hf_tokens=[{MARK}c]"],
        "identity": {"run_name": "raw", "group": "raw"}, "choices": {"reward": "rule"}, "seeds": {"g": 1}})
    with build_trackers(cfg.logger, cfg, run, manifest) as tr:
        tr.log({"loss": 1.0}, 0)
    client = MlflowClient(tracking_uri=uri)
    (r,) = client.search_runs([client.get_experiment_by_name("raw").experiment_id])
    assert r.data.params["reward.hf_tokens"] == REDACTED
    assert r.data.params["reward.url"] == f"https://{REDACTED}@h/x"
    assert all(MARK not in v for v in {**r.data.params, **r.data.tags}.values())
    assert _files_with(run / "wandb", [MARK.encode()]) == {}
    assert _files_with(tmp_path / "wandb_home", [MARK.encode()]) == {}
    assert (tmp_path / "mlflow.db").read_bytes().find(MARK.encode()) == -1


def test_run_dir_named_after_a_secret_override(tmp_path: Path) -> None:
    """`hydra.sweep.subdir=${hydra.job.override_dirname}` names the job dir after its overrides: the files are
    found by the real path, while everything stored (paths, run names for the trackers) is redacted."""
    run = tmp_path / "+service.api_key=abc123,seed=0"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- +service.api_key=abc123\n- seed=0\n")
    m = write_start_manifest(run, {"seed": 0, "service": {"api_key": "abc123"}},
                             ["app.py", "+service.api_key=abc123", "seed=0"], {"global": 0}, {},
                             repo_dir=tmp_path).to_dict()
    assert "abc123" not in (run / "manifest.json").read_text() and "abc123" not in json.dumps(m)
    assert m["identity"]["run_name"].endswith(f"+service.api_key={REDACTED},seed=0")
    assert m["overrides"] == [f"+service.api_key={REDACTED}", "seed=0"]
    assert "abc123" not in (run / ".hydra" / "overrides.yaml").read_text()


def test_a_secret_assignment_inside_a_harmless_assignment_is_redacted() -> None:
    """Hydra's overrides.yaml holds `+extra.note='password=x'`: the outer `note=` used to swallow the inner
    `password=` (found by studies/reliability/reliability.py in the run folder's and MLflow's copies of .hydra/)."""
    from rlexp.tracking.redact import redact_text

    assert redact_text("+extra.note='password=Nt-1'") == "+extra.note='password=***REDACTED***'"
    assert redact_text("- +extra.note=db_pass=x1") == "- +extra.note=db_pass=***REDACTED***"
    assert redact_text("max_tokens=8") == "max_tokens=8" and redact_text("a=b=c") == "a=b=c"
