"""Secret redaction: what may be written to a run folder or sent to a tracker. Pure functions on names and
strings (no I/O), used by the manifest (config, overrides, argv, env, hydra info, `.hydra/` copies, git diff) and
again by every tracker before it uploads anything.

Two axes:

* By name (`is_secret_name`): the value of a config key, override, env var or `--flag` whose *name* says
  credential. Names are split into lowercase segments (`WANDB_API_KEY` -> wandb/api/key, `apiKey`, `client-secret`,
  `reward.hf_token`) and matched per segment, never as a raw substring, because the substrings are everywhere in
  an LLM framework's config: `max_tokens`, `tokenizer`, `n_passes`, `bypass_cache`, `compass`, `pass_at_k`,
  `dsn_count`, `kv_cache_gb` must stay readable (and keep changing `config_sha256`). The rules:
  - *strong words* (`password`, `passwd`, `passphrase`, `secret`, `credential(s)`, `creds`, `bearer`, `cookie`) make
    any name a secret, in any segment (`db_password`, `dbpassword`, `AWS_SECRET_ACCESS_KEY`), unless the strong
    word only qualifies a last segment that describes the credential instead of holding it (`password_min_len`,
    `password_file`, `secret_name`, `hf_token_env`): a length, a path or the name of an env var is not a secret,
    and redacting it would hide a real config change;
  - *short words* that are credentials only as the whole last segment: `pass` (`db_pass`, but not `passes`,
    `n_passes`, `bypass`, `compass`, `pass_at_k`), `pwd` (`smtp_pwd`; the shell's `PWD` env var is a directory),
    `dsn` (`sentry_dsn`, not `dsn_count`), `webhook(s)`, `pat` (not `path`), `otp`/`totp`/`hotp`, `sas`, `sig`
    (an Azure SAS's `sig=`); `signature` only when it signs a request (`sas_signature`, not a DSPy `signature`);
    a trailing number counts for the long words only (`API_KEY_2`, but `pass@1` is a metric);
  - *compound names*: `connection_string`, `conn_str`, `webhook_url`, `database_url`, `db_uri` and the like (a
    connection string or a webhook URL *is* the credential);
  - *head words* (`key`, `token`, `auth`, `authorization`, `session`) as the last segment: `hf_token`, `apikey`,
    but not `eos_token`, `sort_key` (a tokenizer token / lookup key qualifier before them) nor `token_ids`; plural
    `tokens` / `keys` count things (`max_tokens`, `num_keys`) unless an issuer or kind of credential qualifies
    them (`api_keys`, `hf_tokens`).
* By value (`redact_text`): token-shaped substrings of any string, whatever the key: URL userinfo
  (`postgres://user:pw@host` -> `postgres://***REDACTED***@host`), Slack/Discord/Teams webhook paths, `Bearer`,
  provider prefixes (`hf_`, `sk-`, `sk-ant-`, `ghp_`, `github_pat_`, `glpat-`, `xox?-`, `xapp-`, `AKIA`, `AIza`,
  `sk_live_`, `ya29.`, `npm_`, `pypi-`), JWTs, PEM private keys, and `name=value` / `name: value` /
  `--name value` pairs inside a string whose name passes `is_secret_name` (`password=...` in a libpq DSN,
  `AccountKey=...;` in an Azure connection string, `?access_token=...&` in a URL query, `&sig=...` in an Azure
  SAS query string).

Everything is idempotent: redacting a redacted tree changes nothing.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "***REDACTED***"

# --------------------------------------------------------------------------------------------- by name
# Words that always mean a credential, anywhere in a name (also as a segment suffix: `dbpassword`, plural).
_STRONG_WORDS = ("password", "passwd", "passphrase", "passcode", "secret", "credential", "creds", "bearer",
                 "cookie")
# Last segments that describe a credential rather than hold it: behind a strong word (`password_min_len`,
# `secret_name`, `password_file`), the value is a number, a path, a name or a switch.
_METADATA_HEADS = frozenset({
    "len", "length", "min", "max", "count", "num", "size", "chars", "file", "path", "dir", "env", "var", "name",
    "type", "kind", "policy", "required", "enabled", "enable", "disabled", "ttl", "expiry", "expires", "prompt",
    "regex", "pattern", "format", "hint", "manager", "backend", "provider", "store", "rotation",
})
# Credentials only as the whole last segment (`db_pass`), never as a suffix (`bypass`, `compass`) or plural
# (`passes` counts); `pwd` also as a suffix (`dbpwd`: no English word ends in it). Issue 41: `pat` (a personal
# access token; not `path`, `pattern`), `otp`/`totp`/`hotp` (one-time codes and their seeds), `sas` (an Azure
# shared access signature) and `sig` (its `sig=` part, AWS's `X-Amz-Signature`).
_EXACT_HEADS = frozenset({"pass", "pwd", "dsn", "webhook", "webhooks", "pat", "otp", "totp", "hotp", "sas", "sig"})
_SUFFIX_HEADS = ("pwd", "webhook", "webhooks", "otp")
# (qualifier, last segment) pairs that name a credential as a whole.
_COMPOUNDS = frozenset({
    *((q, h) for q in ("connection", "conn") for h in ("string", "str", "uri", "url")),
    *((q, h) for q in ("webhook", "hook") for h in ("url", "uri")),
    *((q, h) for q in ("database", "db") for h in ("url", "uri", "dsn")),
    *((q, h) for q in ("sas", "presigned", "signed") for h in ("url", "uri")),  # the URL carries its signature
    *((q, "code") for q in ("otp", "totp", "mfa", "auth", "oauth", "verification", "recovery", "backup")),
})
_COMPOUND_SEGMENTS = frozenset({"connstr", "connectionstring", "webhookurl", "databaseurl", "dburl"})
# Whole names (case-sensitive) that look like one of the above but are not: the shell's working directory.
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})
# Words that mean a credential when they are the name's last segment (the noun): `hf_token` is a secret,
# `token_ids` and `tokenizer` are not. Matched as a suffix too (`apikey`, `hftoken`, `oauth`).
_HEAD_WORDS = ("key", "token", "auth", "authorization", "session", "sessionid")
# ...unless the qualifier just before says tokenizer token / lookup key (`eos_token`, `sort_key`).
_BENIGN_QUALIFIERS = frozenset({
    "eos", "bos", "pad", "unk", "sep", "cls", "mask", "stop", "special", "start", "end", "eot", "think", "image",
    "vision", "audio", "video", "placeholder", "sort", "metric", "primary", "foreign", "cache", "dict", "group",
    "label", "answer", "prompt", "text", "input", "output", "column", "field", "lookup", "hash", "partition",
    "shard", "rng", "prng", "random", "seed", "index", "reward", "dataset", "data", "sample", "batch", "kv",
})
# What signs a request: `sas_signature`, `SharedAccessSignature`, `url_signature`, `request_signature`.
_SIGNERS = frozenset({"sas", "shared", "access", "url", "request", "webhook", "hmac", "amz", "aws", "azure",
                      "jwt", "upload", "download", "slack", "stripe"})
# Plural `tokens` / `keys` usually count things (`max_tokens`, `max_num_batched_tokens`, `num_keys`); they are
# credentials only behind a qualifier naming an issuer or kind of credential (`api_keys`, `hf_tokens`).
_CREDENTIAL_QUALIFIERS = frozenset({
    "api", "access", "auth", "oauth", "bearer", "hf", "huggingface", "hub", "gh", "github", "gitlab", "wandb",
    "wb", "mlflow", "openai", "anthropic", "cohere", "mistral", "groq", "together", "replicate", "kaggle",
    "refresh", "id", "session", "private", "client", "service", "bot", "app", "user", "personal", "pat",
    "deploy", "signing", "encryption", "ssh", "gpg", "pgp", "aws", "gcp", "azure", "slack", "discord", "secret",
    "master", "admin", "root", "webhook", "hmac", "license", "jwt", "csrf", "xsrf", "login", "cloud",
})


def _name_parts(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name))
    return [p for p in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if p]


def _unnumbered(parts: list[str]) -> list[str]:
    """The segments without a trailing number (`API_KEY_2`, `hfToken2`: the second of its kind)."""
    parts = list(parts)
    while len(parts) > 1 and parts[-1].isdigit():
        parts.pop()
    if parts and not parts[-1].isdigit():
        parts[-1] = parts[-1].rstrip("0123456789")
    return parts


def is_secret_name(name: str) -> bool:
    """True for api_key, WANDB_API_KEY, hfToken, client-secret, db_password, db_pass, smtp_pwd, sentry_dsn,
    connection_string, webhook_url, api_keys, hf_tokens, authorization, passphrase, cookies, session; False for
    max_tokens, tokenizer, token_ids, n_passes, bypass_cache, compass, pass_at_k, dsn_count, password_min_len,
    kv_cache_gb, eos_token, sort_key, PWD. The rules, and why segments, are in the module docstring."""
    name = str(name)
    parts = _name_parts(name)
    if not parts or name.lstrip("-+~") in _NOT_SECRET:
        return False
    base = _unnumbered(parts)  # numbered: only long words (`pass@1` is a metric, `api_key_2` a key)
    return _secret_parts(parts) or (base != parts and base[-1] not in _EXACT_HEADS and _secret_parts(base))


def _secret_parts(parts: list[str]) -> bool:
    if not parts or not parts[-1]:
        return False
    head, prev = parts[-1], (parts[-2] if len(parts) > 1 else "")

    def strong(p: str) -> bool:
        return p.endswith(tuple(w for s in _STRONG_WORDS for w in (s, s + "s")))

    if strong(head) or (head not in _METADATA_HEADS and any(strong(p) for p in parts[:-1])):
        return True
    if head in _EXACT_HEADS or head.endswith(_SUFFIX_HEADS) or head in _COMPOUND_SEGMENTS:
        return True
    if (prev, head) in _COMPOUNDS:
        return True
    if head == "signature":  # a credential when it signs a request (`sas_signature`); a bare `signature` is a
        return prev in _SIGNERS  # DSPy task's, `signature_dim` a size
    if head == "id" and prev in ("session", "sessionid"):
        return True
    for w in _HEAD_WORDS:
        if head.endswith(w):  # singular: a credential unless qualified as a tokenizer token / lookup key
            return prev not in _BENIGN_QUALIFIERS or head != w
        if head.endswith(w + "s"):  # plural: a credential only when qualified as one
            stem = head[: -len(w) - 1]
            return stem in _CREDENTIAL_QUALIFIERS if stem else prev in _CREDENTIAL_QUALIFIERS
    return False


# --------------------------------------------------------------------------------------------- by value
_TOKEN_CHARS = r"A-Za-z0-9._~+/=\-"
_B64 = r"A-Za-z0-9+/=_\-"
# High-confidence token shapes: safe to apply to any text (also to added lines of a code diff).
_TOKEN_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys, also flattened onto one line, or cut off before their END line.
    (re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----(?:.*?-----END \1PRIVATE KEY-----|"
                rf"(?:\\n|\\?[\s{_B64}])*)", re.DOTALL), REDACTED),
    # scheme://user:pass@host -> scheme://***REDACTED***@host (any userinfo: `https://<token>@github.com` too)
    # (Hydra writes overrides escaped: `https\://user\:pass@host`, `Bearer\ tok`; both forms are matched.)
    (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*\\?://)[^/\s?#'\"<>]+@"), rf"\1{REDACTED}@"),
    # Webhook URLs carry their credential in the path.
    (re.compile(r"(\bhooks\.slack\.com/(?:services|workflows|triggers)/)[A-Za-z0-9_/\-]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\b(?:discord|discordapp)\.com/api/webhooks/)[0-9]+/[A-Za-z0-9_\-]+"), rf"\1{REDACTED}"),
    (re.compile(r"(\.webhook\.office\.com/webhookb2/)[^\s'\"]+"), rf"\1{REDACTED}"),
    (re.compile(rf"(?i)\b(bearer)((?:\\?[ \t])+)(?=[{_TOKEN_CHARS}]*\d)[{_TOKEN_CHARS}]{{16,}}"), rf"\1\2{REDACTED}"),
    (re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}"), REDACTED),                     # Hugging Face
    (re.compile(r"(?<![\w-])sk-(?=[\w-]*\d)[\w-]{20,}"), REDACTED),                   # OpenAI / Anthropic
    (re.compile(r"(?<![\w-])[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"), REDACTED),          # Stripe
    (re.compile(r"(?<![\w-])gh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),                    # GitHub
    (re.compile(r"(?<![\w-])github_pat_[A-Za-z0-9_]{40,}"), REDACTED),
    (re.compile(r"(?<![\w-])glpat-[A-Za-z0-9_\-]{20,}"), REDACTED),                    # GitLab
    (re.compile(r"(?<![\w-])xox[abposre]-[A-Za-z0-9\-]{10,}"), REDACTED),               # Slack
    (re.compile(r"(?<![\w-])xapp-\d-[A-Za-z0-9\-]{10,}"), REDACTED),                   # Slack app-level
    (re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"), REDACTED),  # AWS access key id
    (re.compile(r"(?<![\w-])AIza[0-9A-Za-z_\-]{35}"), REDACTED),                        # Google API key
    (re.compile(r"(?<![\w-])ya29\.[0-9A-Za-z_\-]{20,}"), REDACTED),                     # Google OAuth token
    (re.compile(r"(?<![\w-])npm_[A-Za-z0-9]{36}"), REDACTED),                           # npm
    (re.compile(r"(?<![\w-])pypi-[A-Za-z0-9_\-]{50,}"), REDACTED),                      # PyPI
    (re.compile(r"(?<![\w-])eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"), REDACTED),  # JWT
)
# `name=value`, `name: value`, `"name": "value"`, `Authorization: Bearer value` inside a string, where the name
# says credential (also catches a W&B 40-hex key as `WANDB_API_KEY=<hex>`, `?token=...&` in a URL query).
_SP = r"(?:\\?[ \t])"  # a blank, or a Hydra-escaped one
_ASSIGNMENT = re.compile(
    rf"(?P<name>[A-Za-z_][\w.\-]*)(?P<sep>[\"']?{_SP}*\\?[=:]{_SP}*[\"']?)"
    rf"(?P<scheme>(?i:bearer|basic|token|digest){_SP}+)?(?!\$\{{)(?P<val>(?:\\.|[^\s\"',;&?#}}\]\\])+)"
)
# `--api-key value` inside a command string.
_FLAG = re.compile(rf"(?<![\w-])(?P<flag>--?[A-Za-z][\w\-]*)(?P<sp>{_SP}+)(?P<val>[^\s\"'\-\\][^\s\"']*)")


def redact_tokens(text: str) -> str:
    """Replace token-shaped substrings (URL userinfo, webhook paths, Bearer, provider prefixes, JWTs, PEM keys)."""
    for pattern, repl in _TOKEN_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def _assignment_sub(m: re.Match[str]) -> str:
    head = f"{m.group('name')}{m.group('sep')}{m.group('scheme') or ''}"
    if not is_secret_name(m.group("name")):  # the value may hold its own `password=...` (`note='password=x'`)
        val = m.group("val")
        return head + (redact_text(val) if ("=" in val or ":" in val) and val != m.group(0) else val)
    return head + REDACTED


def _flag_sub(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("flag").lstrip("-")):
        return m.group(0)
    return f"{m.group('flag')}{m.group('sp')}{REDACTED}"


def redact_text(text: str) -> str:
    """Redaction by value of one string: token shapes, then `name=value` / `--name value` with a secret name."""
    if not isinstance(text, str) or not text:
        return text
    text = redact_tokens(text)
    if "=" in text or ":" in text:
        text = _ASSIGNMENT.sub(_assignment_sub, text)
    if "-" in text:
        text = _FLAG.sub(_flag_sub, text)
    return text


_INTERPOLATION = re.compile(r"^\$\{[^{}]*\}$")


def _keep_under_secret_name(v: Any, keep_interpolations: bool) -> bool:
    """A secret-named key keeps values that cannot be a credential: null, booleans (`use_auth_token: true`),
    empty strings, and (in unresolved Hydra files) a bare `${oc.env:HF_TOKEN}` interpolation."""
    if v is None or isinstance(v, bool) or v == "":
        return True
    return keep_interpolations and isinstance(v, str) and bool(_INTERPOLATION.match(v))


def redact(obj: Any, *, keep_interpolations: bool = False) -> Any:
    """Copy of a JSON-like tree, redacted by name (values of secret-looking keys, any depth) and by value
    (token shapes in every string). Idempotent."""
    if isinstance(obj, Mapping):
        return {
            k: (REDACTED if is_secret_name(str(k)) and not _keep_under_secret_name(v, keep_interpolations)
                else redact(v, keep_interpolations=keep_interpolations))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [redact(v, keep_interpolations=keep_interpolations) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def redact_override(arg: str) -> str:
    """`+wandb.api_key=abc` -> `+wandb.api_key=***REDACTED***`; values are scanned for token shapes
    (`x.uri=https://u:p@h` -> `x.uri=https://***REDACTED***@h`) on their own, so a value that itself reads
    `password=...` is caught too."""
    arg = str(arg)
    m = re.match(r"^([~+]{0,2}[-\w./@:]+)=(.*)$", arg, flags=re.DOTALL)
    if not m:
        return redact_text(arg)
    if is_secret_name(m.group(1).lstrip("-~+").split("@")[0]) and m.group(2) != "":
        return f"{m.group(1)}={REDACTED}"
    return f"{m.group(1)}={redact_text(m.group(2))}"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Command line with secret overrides, `--secret-flag VALUE` pairs and token-shaped values redacted."""
    out: list[str] = []
    hide_next = False
    for a in map(str, argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif re.match(r"^--?[A-Za-z]", a) and "=" not in a and is_secret_name(a.lstrip("-")):
            out.append(a)
            hide_next = True
        else:
            out.append(redact_override(a))
    return out
