"""Which configuration won: runs grouped into configurations, declared headlines, the ranked verdict.

Runs that differ only in a nuisance key (`NUISANCE_KEYS`: the seed) are one *configuration*; per configuration
and headline metric the answer is the mean over seeds, its 95% t-interval (rlexp.tracking.stats; n=1: no
interval) and n. The ranking follows the first headline, equal means the next ones; the winner is compared
with the runner-up paired over the seeds both ran (difference of the per-seed values, t-interval on those
differences); with fewer than `MIN_PAIRED_SEEDS` (3) shared seeds, or an interval covering zero,
it says "not distinguishable" and why: two seeds give an interval, but one so sensitive to a single
unlucky seed that a sweep under load called a winner on two (issue 45).

Every configuration's change from its start is shown beside its value (`Headline.change`: the
statistic minus the curve's first logged value, for `eval/*` the step-0 evaluation, with its
interval over seeds), and a winner that did not beat its start is called out in the sentence:
ranking first among runs that all got worse is not a result.

Headlines are declared (`Headline`: metric, statistic, direction), default `DEFAULT_HEADLINES`: held-out
accuracy (final and AUC), reward/mean (final) and wall time; never the raw loss first. AUC is the trapezoid
area under the curve over steps divided by the step span, i.e. the curve's mean height: runs of one length
compare on it directly. "best" follows each metric's declared direction (`DIRECTIONS`).

Why a module of its own: the same answer is given by `rlexp compare` (files and plots), the multirun summary
and the last W&B run of a sweep (a table), and trackers sit below the command-line tools.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .cells import md_text
from .runs import NUISANCE_KEYS, RunRecord
from .stats import METHOD, Estimate, estimate

# Which way is better, per metric name, first match wins. Declared, not guessed from the value: a metric
# matching none has no "best" (its column stays empty and the notes say so).
DIRECTIONS: tuple[tuple[str, str], ...] = (
    (r"(^|/)time/|_s$|(^|/)eta", "min"),
    (r"unparseable|truncat|skipped|stale", "min"),
    (r"loss|error|(^|/)kl|perplexity|ppl|regret|logprob_diff|fpr", "min"),
    (r"accuracy|reward|pass@|auc|tpr|correct|selection|gap_closed|partial_credit", "max"),
)
STATISTICS = ("final", "best", "auc")
MIN_PAIRED_SEEDS = 3  # fewer shared seeds than this: the verdict never says "distinguishable"

_MISSING = object()


def direction(metric: str) -> str | None:
    """"max", "min" or None (not declared) for a metric name."""
    for pattern, d in DIRECTIONS:
        if re.search(pattern, metric, re.I):
            return d
    return None


def lower_is_better(metric: str) -> bool:
    return direction(metric) == "min"



@dataclass(frozen=True)
class Headline:
    """One column of the verdict: which metric, which statistic of each run's curve, which way is better."""
    metric: str
    stat: str = "final"
    direction: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Headline:
        """`eval/accuracy`, `eval/accuracy:auc`, `loss:best:min`."""
        parts = spec.split(":")
        metric, stat = parts[0], (parts[1] if len(parts) > 1 else "final")
        d = parts[2] if len(parts) > 2 else direction(metric)
        if stat not in STATISTICS:
            raise ValueError(f"--metrics {spec}: statistic {stat!r} is not one of {', '.join(STATISTICS)}")
        if d not in ("max", "min", None):
            raise ValueError(f"--metrics {spec}: direction {d!r} is not max or min")
        return cls(metric, stat, d)

    @property
    def label(self) -> str:
        return f"{self.metric} {self.stat}"

    def of(self, run: RunRecord) -> float | None:
        """This headline's value for one run: its last, best or mean-height (AUC) value of the curve."""
        xs, ys = run.series(self.metric)
        pts = [(x, y) for x, y in zip(xs, ys) if not math.isnan(y)]
        if not pts:
            return None
        if self.stat == "final":
            return pts[-1][1]
        if self.stat == "best":
            if self.direction is None:
                return None
            return (min if self.direction == "min" else max)(y for _, y in pts)
        if len(pts) == 1 or pts[-1][0] == pts[0][0]:
            return pts[0][1]
        area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in itertools.pairwise(pts))
        return area / (pts[-1][0] - pts[0][0])

    def change(self, run: RunRecord) -> float | None:
        """This headline's value minus the curve's first logged value (an `eval/*` metric's
        step-0 evaluation): what the run gained over where it started. None without a value or
        with a single point."""
        _, ys = run.series(self.metric)
        pts = [y for y in ys if not math.isnan(y)]
        v = self.of(run)
        return None if v is None or len(pts) < 2 else v - pts[0]


DEFAULT_HEADLINES = (Headline("eval/accuracy", "final", "max"), Headline("eval/accuracy", "auc", "max"),
                     Headline("reward/mean", "final", "max"), Headline("time/wall_s", "final", "min"))


@dataclass
class Configuration:
    """Runs that differ only in nuisance keys (the seed): one row of the verdict."""
    label: str
    values: dict[str, Any]  # the varying, non-nuisance config keys -> this configuration's value
    runs: list[RunRecord] = field(default_factory=list)
    colour: str = "C0"

    def seeds(self) -> list[Any]:
        return [seed_of(r) for r in self.runs]

    def per_seed(self, h: Headline) -> dict[Any, float]:
        return {seed_of(r): v for r in self.runs if (v := h.of(r)) is not None}

    def estimate(self, h: Headline) -> Estimate | None:
        return estimate(list(self.per_seed(h).values()) if self._seeds_unique() else
                        [v for r in self.runs if (v := h.of(r)) is not None])

    def change(self, h: Headline) -> Estimate | None:
        """The change from the start (`Headline.change`) over this configuration's runs, with its
        interval."""
        return estimate([v for r in self.runs if (v := h.change(r)) is not None])

    def _seeds_unique(self) -> bool:
        s = [json.dumps(x, default=repr) for x in self.seeds()]
        return len(set(s)) == len(s)


def seed_of(run: RunRecord) -> Any:
    """The run's seed, hashable (a folder's manifest may hold a list or an object there: its JSON text)."""
    vals = tuple(v if v is None or isinstance(v, (str, int, float)) else json.dumps(v, sort_keys=True, default=repr)
                 for v in (run.config.get(k) for k in NUISANCE_KEYS))
    return vals[0] if len(vals) == 1 else vals


def config_diff(runs: Sequence[RunRecord]) -> list[str]:
    """Keys whose values are not identical across all runs (a key missing in some run counts as different)."""
    keys = sorted({k for r in runs for k in r.config})
    diff = []
    for k in keys:
        vals = [json.dumps(r.config.get(k, _MISSING), sort_keys=True, default=repr) for r in runs]
        if len(set(vals)) > 1:
            diff.append(k)
    return diff


def _fmt(v: Any) -> str:
    if v is None or v is _MISSING:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def group_configurations(runs: Sequence[RunRecord], origins: Sequence[int] | None = None) -> list[Configuration]:
    """Configurations in order of first appearance. Two runs with the same configuration *and* the same seed
    are not two seeds (one sweep read twice, or two sweeps): they stay apart, told by where they came from."""
    diff = [k for k in config_diff(runs) if k not in NUISANCE_KEYS]
    origins = list(origins) if origins is not None else [0] * len(runs)
    keyed: dict[str, list[tuple[int, RunRecord]]] = {}
    for o, r in zip(origins, runs):
        key = json.dumps([r.config.get(k, None) for k in diff], sort_keys=True, default=repr)
        keyed.setdefault(key, []).append((o, r))
    out: list[Configuration] = []
    for members in keyed.values():
        first = members[0][1]
        values = {k: first.config.get(k, _MISSING) for k in diff}
        label = ",".join(f"{k}={_fmt(v)}" for k, v in values.items()) or "all runs"
        seeds = [json.dumps(seed_of(r), default=repr) for _, r in members]
        if len(set(seeds)) == len(seeds):
            out.append(Configuration(label, values, [r for _, r in members]))
            continue
        by_origin: dict[int, list[RunRecord]] = {}
        for o, r in members:
            by_origin.setdefault(o, []).append(r)
        for rs in by_origin.values():
            out.append(Configuration(f"{label} [{rs[0].source}]" if len(by_origin) > 1 else label, values, rs))
    for i, c in enumerate(out):  # by first appearance, so a colour stays with its configuration across figures
        c.colour = f"C{i % 10}"
    return out


@dataclass
class Verdict:
    headline: Headline
    ranked: list[Configuration]
    sentence: str
    difference: Estimate | None = None
    paired_seeds: list[Any] = field(default_factory=list)
    distinguishable: bool = False
    # The winner's change from its start, and whether it beat it (None: no start to compare with).
    change: Estimate | None = None
    beat_start: bool | None = None

    @property
    def best(self) -> Configuration | None:
        return self.ranked[0] if self.ranked else None


def _key(c: Configuration, h: Headline) -> float:
    e = c.estimate(h)
    if e is None or h.direction is None:
        return math.inf
    return -e.mean if h.direction == "max" else e.mean


def rank(configs: Sequence[Configuration], h: Headline, tie_breaks: Sequence[Headline] = ()) -> list[Configuration]:
    """Best first by the headline's direction, equal means ordered by the next headlines; configurations
    without a value last, in their own order."""
    have = [c for c in configs if c.estimate(h) is not None]
    lacking = [c for c in configs if c.estimate(h) is None]
    if h.direction is not None:
        have.sort(key=lambda c: tuple(_key(c, x) for x in (h, *tie_breaks)))
    return have + lacking


def verdict(configs: Sequence[Configuration], h: Headline, tie_breaks: Sequence[Headline] = ()) -> Verdict:
    ranked = rank(configs, h, tie_breaks)
    valued = [c for c in ranked if c.estimate(h) is not None]
    what = f"{h.metric} ({h.stat}, {'higher' if h.direction == 'max' else 'lower'} is better)"
    if not valued or h.direction is None:
        why = "no configuration has it" if not valued else "its direction is not declared"
        return Verdict(h, ranked, f"No winner by {h.metric} {h.stat}: {why}.")
    best = valued[0]
    e = best.estimate(h)
    assert e is not None
    change, beat = best.change(h), None
    head = f"Best configuration by {what}: {best.label} — {e.text()}."
    if change is not None:
        beat = change.mean > 0 if h.direction == "max" else change.mean < 0
        head += start_note(change, beat)
    if len(valued) == 1:
        return Verdict(h, ranked, head + " It is the only configuration with this metric.",
                       change=change, beat_start=beat)
    second = valued[1]
    e2 = second.estimate(h)
    assert e2 is not None
    head += f" Runner-up: {second.label} — {e2.text()}."
    if e2.mean == e.mean:
        head += (" Tied on this metric" + (f"; ordered by {', '.join(x.label for x in tie_breaks)}."
                                           if tie_breaks else "."))
    a, b = best.per_seed(h), second.per_seed(h)
    common = [s for s in a if s in b]
    if not (best._seeds_unique() and second._seeds_unique()) or len(common) < 2:
        why = ("they share fewer than 2 seeds, so no paired comparison" if len(common) < 2
               else "seeds repeat within a configuration, so no paired comparison")
        return Verdict(h, ranked, head + f" Not distinguishable: {why}.", paired_seeds=common,
                       change=change, beat_start=beat)
    d = estimate([a[s] - b[s] for s in common])
    assert d is not None and d.half is not None
    dist = not d.covers_zero() and len(common) >= MIN_PAIRED_SEEDS
    method = METHOD.replace("over seeds", "on paired differences")
    tail = (f" Paired difference over seeds {', '.join(_fmt(s) for s in common)}: {d.mean:+.4g} "
            f"[{d.low:+.4g}, {d.high:+.4g}] ({method}): ")
    if dist:
        tail += "distinguishable."
    elif len(common) < MIN_PAIRED_SEEDS:
        tail += (f"not distinguishable: only {len(common)} paired seeds, and a difference is "
                 f"called with at least {MIN_PAIRED_SEEDS} (run more seeds).")
    else:
        tail += "not distinguishable (the interval covers zero)."
    return Verdict(h, ranked, head + tail, d, common, dist, change, beat)


def start_note(change: Estimate, beat: bool) -> str:
    """The sentence's word on the winner's change from its start: a warning when it did not beat
    it."""
    rng = "" if change.half is None else f" [{change.low:+.4g}, {change.high:+.4g}]"
    told = f"{change.mean:+.4g}{rng} (n={change.n})"
    if not beat:
        return f" WARNING: it did not beat its start: change from its first value {told}."
    if change.covers_zero() and change.half is not None:
        return f" Its change from its start, {told}, is within seed noise."
    return f" Change from its start: {told}."


def build_table(configs: Sequence[Configuration], headlines: Sequence[Headline]
                ) -> tuple[list[str], list[list[str]]]:
    keys = list(configs[0].values) if configs else []
    header = ["rank", "configuration", *keys, "n", "seeds"]
    for h in headlines:
        header += [f"{h.label} mean", f"{h.label} ±95%"]
    first = headlines[:1]  # the ranking headline's change from the start
    for h in first:
        header += [f"{h.label} change from start mean", f"{h.label} change from start ±95%"]
    header += ["status"]
    rows = []
    for i, c in enumerate(configs, 1):
        row = [str(i), c.label, *(_fmt(c.values.get(k)) for k in keys), str(len(c.runs)),
               " ".join(_fmt(s) for s in c.seeds())]
        for e in [c.estimate(h) for h in headlines] + [c.change(h) for h in first]:
            row += ["", ""] if e is None else [_fmt(e.mean), "" if e.half is None else _fmt(e.half)]
        st = sorted({r.status or "unknown" for r in c.runs})
        row.append(",".join(st))
        rows.append(row)
    return header, rows


def markdown_table(configs: Sequence[Configuration], headlines: Sequence[Headline]) -> str:
    """The table people read: one cell `mean ± half-width` per headline, the configuration named once."""
    arrow = {"max": "↑", "min": "↓", None: "?"}
    header = ["rank", "configuration", "n",
              *(f"{h.label} ({arrow[h.direction]})" for h in headlines),
              *(f"{h.label}: change from start" for h in headlines[:1])]
    rows = []
    for i, c in enumerate(configs, 1):
        cells = []
        for e in [c.estimate(h) for h in headlines] + [c.change(h) for h in headlines[:1]]:
            cells.append("" if e is None else _fmt(e.mean) + ("" if e.half is None else f" ± {_fmt(e.half)}"))
        rows.append([str(i), c.label, str(len(c.runs)), *cells])
    return to_markdown(header, rows)


def build_run_table(runs: Sequence[RunRecord], headlines: Sequence[Headline]) -> tuple[list[str], list[list[str]]]:
    diff = config_diff(runs)
    header = ["run", "status", *diff, *(h.label for h in headlines), "steps", "wall_s"]
    rows = []
    for r in runs:
        steps = [h["step"] for h in r.history if "step" in h]
        walls = [h["_wall_s"] for h in r.history if "_wall_s" in h]
        rows.append([r.name, r.status or "", *(_fmt(r.config.get(k, _MISSING)) for k in diff),
                     *(_fmt(h.of(r)) for h in headlines),
                     str(max(steps)) if steps else "", _fmt(max(walls)) if walls else ""])
    return header, rows


def unique_names(runs: Sequence[RunRecord]) -> None:
    """Runs of the same name (two sweeps with the same overrides, one run read from two sources) get their
    source appended, so no row stands for two runs."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.name] = counts.get(r.name, 0) + 1
    for r in runs:
        if counts[r.name] > 1:
            r.name = f"{r.name} [{r.source}]"
    seen: dict[str, int] = {}
    for r in runs:  # the very same source given twice
        seen[r.name] = seen.get(r.name, 0) + 1
        if seen[r.name] > 1:
            r.name = f"{r.name} #{seen[r.name]}"


def to_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Every cell escaped (rlexp.tracking.cells.md_text): names and values come from the runs' authors."""
    esc = [[md_text(c) for c in r] for r in [header, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def default_headlines(runs: Sequence[RunRecord]) -> list[Headline]:
    present = {k for r in runs for row in r.history for k in row}
    return [h for h in DEFAULT_HEADLINES if h.metric in present]


@dataclass
class Answer:
    """What every consumer of a comparison shows: the headlines used, the configurations in order of first
    appearance (their colours), and the verdict (ranked, with the winner sentence)."""
    headlines: list[Headline]
    configurations: list[Configuration]
    verdict: Verdict


def answer(runs: Sequence[RunRecord], metrics: Sequence[str] | None = None,
           origins: Sequence[int] | None = None) -> Answer:
    """Group `runs` into configurations and rank them by the declared headlines (`metrics`, specs as
    `Headline.parse` reads them; default: those of `DEFAULT_HEADLINES` the runs logged)."""
    headlines = [Headline.parse(m) for m in metrics] if metrics else default_headlines(runs)
    configs = group_configurations(runs, origins)
    v = (verdict(configs, headlines[0], headlines[1:]) if headlines
         else Verdict(Headline(""), list(configs), "No headline metric in these runs."))
    return Answer(headlines, configs, v)
