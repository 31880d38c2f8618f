"""Cross-check rlexp's multiple-choice scoring against lm-evaluation-harness on the same responses.

    python studies/crosscheck/crosscheck.py --lm-eval-python /tmp/lmeval-venv/bin/python \\
        --out studies/crosscheck/results

lm-eval is NOT a dependency of rlexp. It is installed in a separate virtual environment
(`python3.11 -m venv /tmp/lmeval-venv && /tmp/lmeval-venv/bin/pip install --no-deps lm-eval==0.4.13
pyyaml`) and run there as a subprocess: the child reads the `filter_list` of lm-eval's own task
YAMLs (gpqa/cot_zeroshot/_gpqa_cot_zeroshot_yaml, mmlu_pro/_default_template_yaml) and applies
lm-eval's own filter classes (looked up in its filter registry) to the responses. Nothing of lm-eval
is copied here. The final comparison follows the task's `metric_list` (exact_match with ignore_case
/ ignore_punctuation: lower-case, delete `string.punctuation`, compare with the target "(X)" for
GPQA and "X" for MMLU-Pro).

The responses below are written for this check (invented questions, no benchmark content) and cover
the formats models actually produce. Each case that is expected to disagree carries a `why`; a
disagreement without one is reported as UNEXPLAINED.
"""
from __future__ import annotations

import argparse
import json
import string
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from rlexp.envs.answers import check_choice

GPQA_CHOICES = ["Nitrogen", "Oxygen", "Argon", "Carbon dioxide"]
MMLU_CHOICES = [
    "Venus",
    "Earth",
    "Mercury",
    "Mars",
    "Jupiter",
    "Saturn",
    "Uranus",
    "Neptune",
    "Pluto",
    "Ceres",
]

W_FIRST = (
    "lm-eval takes the FIRST 'answer is' statement, rlexp the LAST (models correct themselves; "
    "when a model rambles on past its answer, as in this case, first-wins is right and rlexp is "
    "wrong)."
)
W_THINK = ("rlexp strips <think>...</think> first; lm-eval also scores the decoy inside the "
           "thinking block.")
W_UNCLOSED = (
    "The response stops inside an unclosed <think> block: rlexp treats it as unfinished "
    "reasoning with no answer; lm-eval scores the letter found in it."
)
W_S_PHRASE = (
    "GPQA strict-match needs the exact, case-sensitive phrase 'The answer is ' followed by more "
    "text; 'Answer: C', 'The correct answer is', a box or a bare letter all give [invalid] there."
)
W_S_CASE = ("GPQA strict-match's lookbehind is case-sensitive: 'the answer is (C)' with a "
            "lower-case t fails.")
W_S_TAIL = (
    "GPQA strict-match keeps everything after 'The answer is ' except the last character, so "
    "any words after the letter ('(C) because ...', 'option B', '$\\boxed{D}') make the exact "
    "match fail."
)
W_S_END = (
    "'The answer is B' ending the response: strict-match's (.*)(?=.) drops the last character and "
    "captures an empty string."
)
W_F_PAREN = (
    "GPQA flexible-extract needs a parenthesised '(X)' (or the choice text, or ': X'); a bare "
    "letter ('D.', 'option B', '**B**', \\boxed{C}) is [invalid] there."
)
W_F_LAST = (
    "GPQA flexible-extract takes the LAST '(X)' anywhere in the response; rlexp prefers an "
    "explicit 'answer is' statement and uses a parenthesised letter only when it ends the "
    "response."
)
W_F_MID = (
    "A '(X)' that is neither stated as the answer nor at the end (mid-text, or a response cut "
    "off) is unparseable for rlexp; GPQA flexible-extract takes it."
)
W_F_TEXT = (
    "GPQA flexible-extract falls back to matching the choice TEXT ('Nitrogen'); rlexp scores "
    "letters only, so a choice text without a letter is unparseable."
)
W_CASE = ("rlexp requires an upper-case letter; GPQA strict-match compares case-insensitively, "
          "so '(c)' counts.")
W_M_PHRASE = (
    "MMLU-Pro's regex `answer is \\(?([A-J])\\)?` needs 'answer is' directly followed by the "
    "letter; 'Answer: D', 'answer is: A', 'option J', a box or a bare letter give [invalid]; "
    "rlexp accepts them."
)
W_M_SPACE = (
    "MMLU-Pro's regex allows exactly one space and no markup between 'answer is' and the "
    "letter; rlexp skips markdown '**', '$' and any whitespace (double space, line break)."
)
W_M_CASE = (
    "MMLU-Pro's regex is case-sensitive: 'Answer is (H)' fails there (its prompt asks for "
    "lower-case 'the answer is'); rlexp accepts it."
)


@dataclass(frozen=True)
class Case:
    id: str
    task: str  # "gpqa" (A-D) or "mmlu_pro" (A-J)
    gold: str
    text: str
    # Why the scorers disagree where they are expected to: one reason, or one per lm-eval filter
    # name.
    why: str | dict = ""


def _cases() -> list[Case]:
    g, m = "gpqa", "mmlu_pro"
    S, F = "strict-match", "flexible-extract"
    raw = [
        # canonical and near-canonical
        (g, "C", "Let's think step by step. Nitrogen dominates. The answer is (C)."),
        (g, "C", "The answer is (C)"),
        (g, "A", "The answer is (A).\n"),
        (g, "B", "Reasoning about it... so the answer is (B).", {S: W_S_CASE}),
        (g, "D", "The answer is D.", {F: W_F_PAREN}),
        (g, "B", "The answer is (D)."),
        (m, "C", "the answer is (C)"),
        (m, "J", "Step by step: F = ma is the second law. the answer is (J)."),
        (m, "A", "the answer is A"),
        (m, "E", "So the answer is (E)."),
        (m, "H", "Therefore, the answer is (B)."),
        (m, "G", "The answer is G"),
        # other phrasings
        (g, "C", "Answer: C", {S: W_S_PHRASE}),
        (g, "B", "Answer: (B)", {S: W_S_PHRASE}),
        (g, "A", "**Answer:** A", {S: W_S_PHRASE, F: W_F_PAREN}),
        (g, "B", "The correct answer is (B).", {S: W_S_PHRASE}),
        (g, "C", "The final answer is (C)", {S: W_S_PHRASE}),
        (g, "D", "Final answer: (D)", {S: W_S_PHRASE}),
        (g, "B", "The answer is: B", {S: W_S_PHRASE}),
        (g, "B", "The answer is option B.", {S: W_S_TAIL, F: W_F_PAREN}),
        (g, "C", "ANSWER: C", {S: W_S_PHRASE}),
        (m, "D", "Answer: D", W_M_PHRASE),
        (m, "F", "Answer: (F)", W_M_PHRASE),
        (m, "B", "The correct answer is (B)."),
        (m, "I", "The final answer is I"),
        (m, "C", "ANSWER: C", W_M_PHRASE),
        (m, "A", "The answer is: A", W_M_PHRASE),
        (m, "J", "The answer is option J.", W_M_PHRASE),
        # boxed
        (g, "C", "\\boxed{C}", {S: W_S_PHRASE, F: W_F_PAREN}),
        (g, "A", "Therefore \\boxed{(A)}", {S: W_S_PHRASE}),
        (g, "D", "The answer is $\\boxed{D}$", {S: W_S_TAIL, F: W_F_PAREN}),
        (m, "B", "\\boxed{B}", W_M_PHRASE),
        (m, "E", "So we get \\boxed{E}.", W_M_PHRASE),
        (m, "H", "Answer: $\\boxed{H}$", W_M_PHRASE),
        # bare final letters
        (g, "C", "C", {S: W_S_PHRASE, F: W_F_PAREN}),
        (g, "B", "B.", {S: W_S_PHRASE, F: W_F_PAREN}),
        (g, "A", "(A)", {S: W_S_PHRASE}),
        (g, "D", "After checking each option I pick\n(D)", {S: W_S_PHRASE}),
        (g, "C", "Options (A) and (B) contradict the data.\nC", {S: W_S_PHRASE, F: W_F_LAST}),
        (m, "C", "C", W_M_PHRASE),
        (m, "G", "(G)", W_M_PHRASE),
        (m, "J", "Mercury is closest... wait, the question asks for the law.\n**J**", W_M_PHRASE),
        # several statements / self-correction
        (g, "D", "The answer is (B). Hmm, no: the answer is (D).", {S: W_S_TAIL}),
        (g, "B", "The answer is (B). Hmm, no: the answer is (D)."),
        (
            g,
            "C",
            "I first thought the answer is (A), but recomputing, the answer is (C).",
            {S: W_S_CASE},
        ),
        (m, "D", "the answer is (B). Checking again, the answer is (D).", W_FIRST),
        (m, "B", "the answer is (B). Checking again, the answer is (D).", W_FIRST),
        (m, "F", "At first the answer is (A)?? No. Recomputing: the answer is (F).", W_FIRST),
        # thinking blocks with a decoy
        (g, "C", "<think>Maybe the answer is (A).</think>The answer is (C)."),
        (g, "A", "<think>Maybe the answer is (A).</think>The answer is (C)."),
        (g, "B", "<think>(A)? (D)?</think>\nThe answer is (B)."),
        (m, "C", "<think>the answer is (A)</think> the answer is (C)", W_THINK),
        (m, "E", "<think>the answer is (A) I guess</think>\nthe answer is (E).", W_THINK),
        (m, "A", "<think>hmm</think>the answer is (A)"),
        # letters mentioned elsewhere
        (g, "C", "(A) is wrong and (B) is wrong, so the answer is (C).", {S: W_S_CASE}),
        (g, "C", "The answer is (C) because (A) fails the test.", {S: W_S_TAIL, F: W_F_LAST}),
        (g, "C", "The answer is (C), not (D).", {S: W_S_TAIL, F: W_F_LAST}),
        (g, "C", "(C) Nitrogen is by far the most abundant gas in the atmosphere.", {F: W_F_MID}),
        (
            g,
            "A",
            "Let's think step by step. Option (A) is the first candidate, and it",
            {F: W_F_MID},
        ),
        (m, "C", "the answer is (C) because (A) fails."),
        (m, "B", "(A) and (B) are both plausible; the answer is (B)"),
        (m, "D", "Comparing (D) with (E): the answer is (D)."),
        # choice text instead of a letter
        (g, "A", "The answer is Nitrogen.", {F: W_F_TEXT}),
        (g, "A", "The gas is nitrogen", {F: W_F_TEXT}),
        (g, "B", "It must be Oxygen", {F: W_F_TEXT}),
        (m, "C", "The planet is Mercury."),
        (m, "C", "the answer is Mercury"),
        # out-of-range letters
        (g, "A", "The answer is (E)."),
        (g, "A", "The answer is (A) or maybe (E)", {S: W_S_TAIL, F: W_F_LAST}),
        (m, "A", "the answer is (K)"),
        # markdown and spacing
        (g, "B", "The answer is **(B)**"),
        (g, "B", "The answer is **B**", {F: W_F_PAREN}),
        (g, "C", "The answer is\n(C)", {S: W_S_PHRASE}),
        (g, "D", "The answer is (D)"),
        (m, "B", "the answer is **B**", W_M_SPACE),
        (m, "B", "the answer is **(B)**", W_M_SPACE),
        (m, "I", "the answer is\n(I)", W_M_SPACE),
        (m, "D", "the answer is  (D)", W_M_SPACE),
        # case
        (g, "C", "The answer is (c).", {S: W_CASE}),
        (g, "C", "the answer is c"),
        (m, "C", "the answer is (c)"),
        (m, "A", "The answer is a bit unclear."),
        (g, "A", "The answer is a noble gas."),
        # no answer / unparseable
        (g, "C", "I don't know."),
        (g, "C", ""),
        (g, "B", "<think>The answer is (B)", W_UNCLOSED),
        (m, "C", "I cannot determine this."),
        (m, "C", "<think>the answer is (C)", W_UNCLOSED),
        (m, "C", ""),
        # wrong but parseable (both scorers should say wrong)
        (g, "A", "The answer is (B)."),
        (g, "D", "The answer is (C)."),
        (m, "A", "the answer is (J)"),
        (m, "J", "the answer is (A)"),
        (g, "C", "The answer is (C). (D) would need more energy.", {S: W_S_TAIL, F: W_F_LAST}),
        (g, "B", "The answer is B", {S: W_S_END, F: W_F_PAREN}),
        (m, "G", "answer is G"),
        (m, "C", "the answer is (C).\n\nQuestion: next one, the answer is (D)", W_FIRST),
        (g, "C", "the answer is (C)", {S: W_S_CASE}),
        (g, "D", "The answer is (D)\n\nThe answer is (A)", {S: W_FIRST}),
        (m, "H", "Answer is (H)", W_M_CASE),
    ]
    return [
        Case(f"{t}-{i:03d}", t, gold, text, *rest) for i, (t, gold, text, *rest) in enumerate(raw)
    ]


# --- lm-eval side (runs in the lm-eval virtual environment) ---------------------------------------
_CHILD = textwrap.dedent(r'''
    import json, sys
    from pathlib import Path
    import yaml
    import lm_eval
    from lm_eval.filters import get_filter

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_constructor("!function", lambda loader, node: None)

    req = json.load(sys.stdin)
    tasks_dir = Path(lm_eval.__file__).parent / "tasks"
    out = {"lm_eval_file": lm_eval.__file__, "tasks": {}}
    for task, spec in req["tasks"].items():
        cfg = yaml.load((tasks_dir / spec["yaml"]).read_text(), Loader=Loader)
        docs = [{"choices": c} for c in spec["choices"]]
        results = {}
        for fl in cfg["filter_list"]:
            resps = [[r] for r in spec["responses"]]
            for step in fl["filter"]:
                kwargs = {k: v for k, v in step.items() if k != "function"}
                resps = list(get_filter(step["function"])(**kwargs).apply(resps, docs))
            results[fl["name"]] = {"extracted": resps, "filter": fl["filter"]}
        metric = next(m for m in cfg["metric_list"] if m["metric"] == "exact_match")
        out["tasks"][task] = {"yaml": spec["yaml"], "filters": results, "metric": metric}
    print(json.dumps(out))
''')

LM_EVAL_TASKS = {
    "gpqa": "gpqa/cot_zeroshot/_gpqa_cot_zeroshot_yaml",
    "mmlu_pro": "mmlu_pro/_default_template_yaml",
}


def run_lm_eval(python: str, cases: list[Case]) -> dict:
    req = {"tasks": {t: {"yaml": y, "responses": [c.text for c in cases if c.task == t],
                         "choices": [GPQA_CHOICES if t == "gpqa" else MMLU_CHOICES
                                     for c in cases if c.task == t]}
                     for t, y in LM_EVAL_TASKS.items()}}
    proc = subprocess.run(
        [python, "-c", _CHILD], input=json.dumps(req), capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise SystemExit(
            f"lm-eval child failed (is lm-eval installed in {python}?):\n{proc.stderr[-3000:]}"
        )
    return json.loads(proc.stdout)


def lm_eval_correct(extracted: str, gold: str, task: str, metric: dict) -> bool:
    """exact_match as configured in the task's metric_list; targets are "(X)" (GPQA) and "X"
    (MMLU-Pro)."""
    pred, ref = extracted, f"({gold})" if task == "gpqa" else gold
    if metric.get("ignore_case"):
        pred, ref = pred.lower(), ref.lower()
    if metric.get("ignore_punctuation"):
        table = str.maketrans("", "", string.punctuation)
        pred, ref = pred.translate(table), ref.translate(table)
    return pred == ref


def _why(c: Case, filter_name: str) -> str:
    return c.why.get(filter_name, "") if isinstance(c.why, dict) else c.why


def compare(lm: dict, cases: list[Case]) -> tuple[list[dict], dict]:
    rows, summary = [], {}
    for task in LM_EVAL_TASKS:
        tc = [c for c in cases if c.task == task]
        info = lm["tasks"][task]
        for fname, fres in info["filters"].items():
            agree = 0
            for c, ext in zip(tc, fres["extracted"]):
                lm_ok = lm_eval_correct(ext, c.gold, task, info["metric"])
                ours = check_choice(c.gold, c.text, 4 if task == "gpqa" else 10)
                same = ours.correct == lm_ok
                agree += same
                rows.append(
                    {
                        "case": c.id,
                        "task": task,
                        "filter": fname,
                        "gold": c.gold,
                        "text": c.text,
                        "rlexp_extracted": ours.extracted,
                        "rlexp_correct": ours.correct,
                        "lm_eval_extracted": ext,
                        "lm_eval_correct": lm_ok,
                        "agree": same,
                        "why": "" if same else (_why(c, fname) or "UNEXPLAINED"),
                    }
                )
            summary[f"{task}/{fname}"] = {"n": len(tc), "agree": agree, "rate": agree / len(tc)}
    return rows, summary


def write_report(out: Path, rows: list[dict], summary: dict, lm: dict, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    n_all = sum(s["n"] for s in summary.values())
    agree_all = sum(s["agree"] for s in summary.values())
    lines = [
        "# Edge cases of multiple-choice answer extraction: rlexp vs lm-evaluation-harness's "
        "filters",
        "",
        f"Produced by: `{command}`",
        "",
        "What this shows: on responses written by hand to probe the edges of answer extraction "
        "(odd casing, boxes, markdown, answers restated, unfinished thinking), where rlexp's "
        "extractor and lm-eval's GPQA and MMLU-Pro filters give different verdicts, and the "
        "cause of each difference. What it does not show: how often the two agree on a model's "
        "real outputs. The set is built from the awkward cases, so its agreement rate says "
        "nothing about benchmark numbers; on responses in the prompt's own format ('The answer "
        "is (X).') both give the same verdict. Comparing benchmark scores with lm-eval's would "
        "need both run on the same model's generations, which this machine cannot produce for a "
        "real model.",
        "",
        f"lm-eval: the filters of `{LM_EVAL_TASKS['gpqa']}` and `{LM_EVAL_TASKS['mmlu_pro']}` "
        f"read at run time from the installed package (`{lm['lm_eval_file']}`), applied with "
        "lm-eval's own filter classes; scored with each task's exact_match settings. rlexp: "
        "`rlexp.envs.answers.check_choice`.",
        f"{len({r['case'] for r in rows})} responses written for this check (tricky formats "
        "included); agreement = both scorers give the same correct/incorrect verdict.",
        "",
        "| task / lm-eval filter | responses | agree | agreement |",
        "|---|---|---|---|",
    ]
    for k, s in summary.items():
        lines.append(f"| {k} | {s['n']} | {s['agree']} | {s['rate']:.1%} |")
    lines += [f"| all comparisons | {n_all} | {agree_all} | {agree_all / n_all:.1%} |", "",
              "The regexes used by lm-eval (from its YAMLs):", ""]
    for task, info in lm["tasks"].items():
        for fname, fres in info["filters"].items():
            lines.append(f"- {task} / {fname}: `{json.dumps(fres['filter'])}`")
    dis = [r for r in rows if not r["agree"]]
    lines += [
        "",
        "## Causes (each disagreement has exactly one scorer matching the gold letter)",
        "",
        "| cause | disagreements | rlexp right | lm-eval right |",
        "|---|---|---|---|",
    ]
    for why in dict.fromkeys(r["why"] for r in dis):
        these = [r for r in dis if r["why"] == why]
        ours = sum(r["rlexp_correct"] for r in these)
        lines.append(f"| {why} | {len(these)} | {ours} | {len(these) - ours} |")
    lines += [
        "",
        "The response set over-represents awkward formats on purpose (it is a test of the "
        "edges); on the canonical 'The answer is (X).' responses the scorers agree. rlexp's "
        "gpqa_diamond and mmlu_pro numbers are therefore comparable to lm-eval's only for "
        "models that follow the prompt's format; for other models rlexp is the more lenient "
        "scorer (the rows above say where).",
    ]
    unexplained = [r for r in rows if not r["agree"] and r["why"] == "UNEXPLAINED"]
    lines += [
        "",
        f"## Disagreements ({sum(not r['agree'] for r in rows)}; unexplained: {len(unexplained)})",
        "",
        "| case | filter | gold | response | rlexp | lm-eval | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["agree"]:
            continue
        text = r["text"].replace("\n", "\\n").replace("|", "\\|")
        lines.append(
            f"| {r['case']} | {r['filter']} | {r['gold']} | `{text}` | {r['rlexp_extracted']} "
            f"({'right' if r['rlexp_correct'] else 'wrong'}) | {r['lm_eval_extracted']} "
            f"({'right' if r['lm_eval_correct'] else 'wrong'}) | {r['why']} |"
        )
    path = out / "crosscheck_mc.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "crosscheck_mc.json").write_text(
        json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lm-eval-python",
        required=True,
        help="python of a venv with lm-eval (and pyyaml) installed",
    )
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = p.parse_args(argv)
    cases = _cases()
    lm = run_lm_eval(a.lm_eval_python, cases)
    rows, summary = compare(lm, cases)
    cmd = "python studies/crosscheck/crosscheck.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    path = write_report(Path(a.out), rows, summary, lm, cmd)
    for k, s in summary.items():
        print(f"{k}: {s['agree']}/{s['n']} = {s['rate']:.1%}")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
