"""Write the generated documentation pages: docs/config.md (the config reference, from the typed
schema and the comments on its fields) and docs/tokenizer.md (the CPU tokenizer's vocabulary, from
its asset).

    python scripts/gen_docs.py          # rewrite both
    python scripts/gen_docs.py --check  # exit 1 when one is stale or a config field has no comment
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlexp.cluster.registry import job_settings  # noqa: E402
from rlexp.config import reference  # noqa: E402
from rlexp.models import tokenizer_doc  # noqa: E402


def pages() -> dict[Path, str]:
    """Each generated page and its text."""
    return {
        ROOT / "docs" / "config.md": reference.render(job_settings()),
        ROOT / "docs" / "tokenizer.md": tokenizer_doc.render(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--check", action="store_true", help="fail instead of writing when a page is stale"
    )
    args = ap.parse_args()
    missing = reference.undocumented(job_settings())
    if missing:
        print(
            "config fields without a comment where they are declared (write one directly above the "
            "field or at the end of its line):\n  " + "\n  ".join(missing),
            file=sys.stderr,
        )
        return 1
    stale = [p for p, text in pages().items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(
                f"{p.relative_to(ROOT)} is stale: run python scripts/gen_docs.py", file=sys.stderr
            )
        return 1 if stale else 0
    for p in stale:
        p.write_text(pages()[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
