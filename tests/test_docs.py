"""The documentation stays true: every relative link resolves, generated pages match their sources.

- Every relative link (and `#anchor`, by GitHub's heading slugs) in README.md, docs/**/*.md and
  studies/**/README.md resolves to a file or heading that exists.
- Every config field has a comment where it is declared, and docs/config.md is what
  `python scripts/gen_docs.py` writes from them.
- docs/tokenizer.md lists exactly the characters of rlexp/assets/rlexp_char_tokenizer.json.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
import unicodedata
from pathlib import Path

import pytest

from rlexp.config import reference
from rlexp.models import tokenizer_doc
from rlexp.models.tokenizer import ASSET, CharTokenizer

REPO = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.M | re.S)
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def doc_files(root: Path = REPO) -> list[Path]:
    files = [
        root / "README.md",
        *sorted((root / "docs").rglob("*.md")),
        *sorted((root / "studies").rglob("README.md")),
    ]
    return [f for f in files if f.is_file()]


def _prose(text: str) -> str:
    """`text` with fenced blocks and code spans blanked (no links there), line numbers kept."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return _CODE.sub(blank, _FENCE.sub(blank, text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` `_` dropped, spaces `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; repeated ones numbered as GitHub does (`-1`)."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """`FILE:LINE: target (why)` for each relative link of `path` that does not resolve."""
    text = path.read_text()
    prose = _prose(text)
    out = []
    for m in [*_INLINE.finditer(prose), *_REFDEF.finditer(prose)]:
        target = m.group(1)
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        line = prose.count("\n", 0, m.start()) + 1
        why = None
        if not dest.exists():
            why = "no such file"
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            why = f"no heading #{anchor} in {dest.name}"
        if why:
            out.append(
                f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}: "
                f"{target} ({why})"
            )
    return out


def test_every_relative_link_resolves():
    files = doc_files()
    assert REPO / "README.md" in files and len(files) > 10, files
    assert (
        sum(len(_INLINE.findall(_prose(f.read_text()))) for f in files) > 50
    )  # the checker sees links
    broken = [b for f in files for b in broken_links(f)]
    assert not broken, "broken links in the docs:\n" + "\n".join(broken)


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## The `rlexp train` step, again!\n\n## Twice\n\n## Twice\n"
    )
    (tmp_path / "page.md").write_text(
        "# Page\n\n"
        "[ok](other.md) [ok anchor](other.md#the-rlexp-train-step-again) "
        "[second](other.md#twice-1)\n"
        "[self](#page) [web](https://example.org/x.md) `[in code](missing.md)`\n"
        "```\n[in a fence](missing.md)\n```\n"
        "[gone](missing.md)\n"
        "[bad anchor](other.md#no-such-heading)\n"
        "[bad self](#nowhere)\n"
        "[ref]: ./also_missing.md\n"
    )
    broken = broken_links(tmp_path / "page.md")
    assert [b.split(": ", 1)[1] for b in broken] == [
        "missing.md (no such file)",
        "other.md#no-such-heading (no heading #no-such-heading in other.md)",
        "#nowhere (no heading #nowhere in page.md)",
        "./also_missing.md (no such file)",
    ], broken
    assert [b.split(": ", 1)[0].rsplit(":", 1)[1] for b in broken] == ["8", "9", "10", "11"], broken


def test_slugs_follow_github():
    assert (
        slug("Untrusted run folders and manifests: what rlexp promises")
        == "untrusted-run-folders-and-manifests-what-rlexp-promises"
    )
    assert slug("What `rlexp train` does by default") == "what-rlexp-train-does-by-default"
    assert (
        slug("Slurm: what was run against a real one, and what was not")
        == "slurm-what-was-run-against-a-real-one-and-what-was-not"
    )
    assert slug("model.arch") == "modelarch" and slug("reward.verifiers[]") == "rewardverifiers"


def test_readme_is_short_and_keeps_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 150
    assert "bash scripts/setup.sh && .venv/bin/rlexp train" in text
    assert "bash scripts/setup.sh && bash scripts/test.sh" in text


def test_every_config_field_is_documented():
    from rlexp.cluster.registry import job_settings

    missing = reference.undocumented(job_settings())
    assert not missing, (
        "config fields without a comment where they are declared (write one directly above "
        "the field or at the end of its line, then run python scripts/gen_docs.py):\n  "
        + "\n  ".join(missing)
    )


def test_config_reference_is_up_to_date():
    page = REPO / "docs" / "config.md"
    from rlexp.cluster.registry import job_settings

    assert page.exists() and page.read_text() == reference.render(job_settings()), (
        f"docs/config.md is stale: run {reference.REGENERATE}"
    )
    keys = {d.key for d in reference.walk_all(job_settings())}
    assert {
        "trainer.lr",
        "cluster.job_options.partition",
        "model.unknown_chars",
        "reward.verifiers[].kind",
        "seed",
    } <= keys


def _load(tmp_path: Path, source: str, monkeypatch):
    """A schema module of the test's own, imported from a real file (comments come from source)."""
    mod = tmp_path / "fake_schema_for_docs.py"
    mod.write_text(source)
    spec = importlib.util.spec_from_file_location("fake_schema_for_docs", mod)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_comments_are_read_from_where_the_field_is_declared(tmp_path, monkeypatch):
    """Above (contiguous lines), at the end of the line, or nothing: a blank line or a field between
    breaks the association, so a comment never documents the wrong field."""
    m = _load(
        tmp_path,
        """
from dataclasses import dataclass, field
from enum import StrEnum
Mode = StrEnum("Mode", {"a": "a", "b": "b"})

@dataclass
class Inner:
    # Two lines
    # above.
    x: int = 1
    y: str = "s"  # at the end
    # a comment for nobody

    z: float = 0.5
    w: list[int] = field(default_factory=lambda: [1, 2])

@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    mode: Mode = Mode.b  # the mode
""",
        monkeypatch,
    )
    got = {d.key: (d.type, d.default, d.doc) for d in reference.walk(m.Outer)}
    assert got == {
        "inner.x": ("int", "1", "Two lines above."),
        "inner.y": ("str", "'s'", "at the end"),
        "inner.z": ("float", "0.5", ""),
        "inner.w": ("list[int]", "[1, 2]", ""),
        "mode": ("a | b", "b", "the mode"),
    }
    assert [d.group for d in reference.walk(m.Outer)] == ["inner"] * 4 + [""]
    assert dataclasses.is_dataclass(m.Inner)


def test_tokenizer_page_lists_exactly_the_asset(tmp_path):
    page = (REPO / "docs" / "tokenizer.md").read_text()
    assert page == tokenizer_doc.render(), (
        "docs/tokenizer.md is stale: run python scripts/gen_docs.py"
    )
    tok = CharTokenizer()
    spec = json.loads(ASSET.read_text())
    visible = re.search(r"```text\n(.*?)\n```", page, re.S).group(1)
    assert set(visible) | {" ", "\t", "\n"} == set(spec["chars"]) and len(spec["chars"]) == 97
    # every character listed round-trips; one outside the list is what prepare refuses
    assert tok.unknown(visible + " \t\n") is None and tok.decode(tok.encode(visible)) == visible
    assert tok.unknown("1 → 2") == "→"
    # a changed asset changes the page: the check above cannot pass against a stale page
    smaller = dict(spec, chars=[c for c in spec["chars"] if c != "~"])
    (tmp_path / "tok.json").write_text(json.dumps(smaller))
    assert tokenizer_doc.render(tmp_path / "tok.json") != page
    assert (
        "~"
        not in re.search(r"```text\n(.*?)\n```", tokenizer_doc.render(tmp_path / "tok.json"), re.S)[
            1
        ]
    )


@pytest.mark.parametrize("cmd", [["--check"]])
def test_gen_docs_check_passes(cmd):
    import subprocess

    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_docs.py"), *cmd],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr


def test_config_reference_command_narrows_to_keys_and_groups(capsys):
    from rlexp.cluster.registry import job_settings

    assert reference.main(["trainer.lr", "cluster.job_options"], job_settings()) == 0
    out = capsys.readouterr().out
    assert out.startswith("trainer.lr (float) = 0.001\n    AdamW learning rate")
    assert "cluster.job_options.partition (str | None) = null" in out
    assert "cluster.shm_dir" not in out
    assert reference.main(["trainer.l"]) == 2  # a prefix of a key is not a group
    assert "no key or group 'trainer.l'" in capsys.readouterr().err
    assert reference.main(["--markdown"], job_settings()) == 0
    assert capsys.readouterr().out == reference.render(job_settings())
