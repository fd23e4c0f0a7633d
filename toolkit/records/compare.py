"""Compare two bench records: comparability first, then a verdict per metric and concurrency.

Comparability: every field of the comparability key (``dsv4kit.records.record.KEY_FIELDS``: model and
revision, GPU model and count, context length, dataset, ISL/OSL, range ratio, tokenize-prompt,
seed, concurrency set, prompts per point, backend, client version, the kernel flags the servers
ran with; an unknown one never matches) must be equal, except the
ones the caller explicitly lets differ (``ignore``). Otherwise no verdict is given and the
differing fields are listed. Launch-argument, driver and version differences are reported as
information: they are usually exactly what is being compared.

Verdict per (metric, concurrency), from the valid repetitions of each side:

- Δ% = (mean_new - mean_old) / mean_old; interval = Welch 95% CI of the difference, in % of old.
- threshold = max(noise floor, 3 x pooled CV); floors: throughput 3% at C >= 16 and 5% below,
  median TPOT/ITL 5%, median TTFT 10%, any p99 15%.
- ``improved``/``regressed``: |Δ| > threshold and the interval excludes 0 (direction by metric).
- ``no-change``: |Δ| <= threshold and the noise is small enough to have seen a floor-sized change
  (3 x CV <= floor); with fewer than 2 valid repetitions on a side (no interval): |Δ| <= floor.
- ``inconclusive``: everything else (a big Δ inside the noise, or noise too large to tell), and
  always when a side has fewer than ``MIN_REPETITIONS`` valid repetitions.
  ``invalid``: a side has no valid repetition at that concurrency.

Each metric then gets one verdict over the concurrencies (``metric_verdicts``): ``mixed`` when it
improved at one C and regressed at another, else ``regressed``, ``improved``, ``inconclusive``
(any row inconclusive or invalid) or ``no-change``; the summary names what moved which way.
``outcome``: ``not-comparable``, ``regressed`` (any metric), ``inconclusive`` (nothing regressed,
but something could not be told) or ``ok``. Inconclusive is never read as "no regression": it has
its own exit code (``exitcodes.INCONCLUSIVE``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from dsv4kit.core import exitcodes

from dsv4kit.records import stats
from dsv4kit.records.record import KEY_FIELDS, comparability_key, metric_value, record_api
from dsv4kit.records.served_flags import is_unknown

K_CV = 3.0
#: Outcomes from worst to best: one bad concurrency decides the whole comparison.
OUTCOME_ORDER = ("invalid", "regressed", "inconclusive", "ok")
#: A verdict other than "inconclusive" needs at least this many valid repetitions on each side.
MIN_REPETITIONS = 3
#: metric -> (direction, label). Direction "higher" means higher is better.
METRICS = {
    "decode_tok_s": ("higher", "decode tok/s (delivered in the steady-state window)"),
    "output_throughput": ("higher", "output tok/s (client)"),
    "median_ttft_ms": ("lower", "median TTFT ms"),
    "p99_ttft_ms": ("lower", "p99 TTFT ms"),
    "median_tpot_ms": ("lower", "median TPOT ms"),
    "p99_tpot_ms": ("lower", "p99 TPOT ms"),
    "goodput_req_s": ("higher", "goodput req/s (requests within the TTFT and TPOT SLOs)"),
}
#: The families a summary speaks of, and their metrics.
FAMILIES = {"throughput": ("decode_tok_s", "output_throughput"), "TTFT": ("median_ttft_ms", "p99_ttft_ms"),
            "TPOT": ("median_tpot_ms", "p99_tpot_ms"), "goodput": ("goodput_req_s",)}
INFO_FIELDS = (("server", "launch_args_sha256"), ("server", "resolved_args_sha256"), ("gpus", "driver"),
               ("software", "sglang_version"), ("software", "torch"), ("software", "triton"),
               ("software", "kernel_flags_configured"), ("toolkit", "git_commit"))


def noise_floor(metric: str, concurrency: int) -> float:
    """Smallest relative change (fraction) that can count as a change, whatever the spread."""
    if metric.startswith("p99"):
        return 0.15
    if "ttft" in metric:
        return 0.10
    if "tpot" in metric or "itl" in metric:
        return 0.05
    return 0.03 if concurrency >= 16 else 0.05


@dataclass
class Row:
    metric: str
    concurrency: int
    old_n: int
    new_n: int
    old_mean: Optional[float]
    new_mean: Optional[float]
    delta_pct: Optional[float]
    ci_pct: Optional[tuple[float, float]]
    threshold_pct: Optional[float]
    verdict: str
    #: Why the verdict is invalid or inconclusive, in words (None for a verdict the numbers gave).
    cause: Optional[str] = None

    def to_dict(self) -> dict:
        return dict(self.__dict__, ci_pct=list(self.ci_pct) if self.ci_pct else None)


@dataclass
class Comparison:
    old_id: str
    new_id: str
    comparable: bool
    differences: list[dict] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    info: list[dict] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    #: concurrency -> which side had invalid points there, in words
    invalid_detail: dict = field(default_factory=dict)
    #: (old, new): the API each record measured (``dsv4kit.bench.api``)
    apis: tuple = ("generate", "generate")

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.verdict == "regressed"]

    def metric_verdicts(self) -> dict[str, str]:
        """One verdict per metric over the concurrencies (see the module doc)."""
        out = {}
        for metric in dict.fromkeys(r.metric for r in self.rows):
            verdicts = {r.verdict for r in self.rows if r.metric == metric}
            if {"improved", "regressed"} <= verdicts:
                out[metric] = "mixed"
            elif "regressed" in verdicts:
                out[metric] = "regressed"
            elif "improved" in verdicts:
                out[metric] = "improved"
            elif verdicts & {"inconclusive", "invalid"}:
                out[metric] = "inconclusive"
            else:
                out[metric] = "no-change"
        return out

    def concurrency_outcomes(self) -> dict[int, str]:
        """Per concurrency, the worst of its rows (``OUTCOME_ORDER``; no-change and improved are ok)."""
        out: dict[int, str] = {}
        for r in self.rows:
            word = {"no-change": "ok", "improved": "ok"}.get(r.verdict, r.verdict)
            if r.concurrency not in out or OUTCOME_ORDER.index(word) < OUTCOME_ORDER.index(out[r.concurrency]):
                out[r.concurrency] = word
        return dict(sorted(out.items()))

    @property
    def outcome(self) -> str:
        """The worst over every concurrency and metric: invalid, regressed, inconclusive, ok."""
        if not self.comparable:
            return "not-comparable"
        if not self.rows:
            return "inconclusive"
        return min(self.concurrency_outcomes().values(), key=OUTCOME_ORDER.index)

    def exit_code(self) -> int:
        return {"not-comparable": exitcodes.USAGE, "invalid": exitcodes.CHECK_FAILED,
                "regressed": exitcodes.CHECK_FAILED, "inconclusive": exitcodes.INCONCLUSIVE,
                "ok": exitcodes.OK}[self.outcome]

    def summary(self) -> str:
        """Each concurrency's outcome, then what moved which way, e.g. ``C=1 ok, C=8 invalid (new:
        1 of 3 repetitions invalid); throughput improved (decode_tok_s +29.7% at C=8); ...``."""
        per_c = self.concurrency_outcomes()
        head = ", ".join(f"C={c} {word}" + (f" ({self.invalid_detail[c]})" if word == "invalid" and
                                            self.invalid_detail.get(c) else "") for c, word in per_c.items())
        rest = self._movement()
        return "; ".join(part for part in (head, rest) if part)

    def _movement(self) -> str:
        verdicts = self.metric_verdicts()
        parts = []
        for family, metrics in FAMILIES.items():
            present = [m for m in metrics if m in verdicts]
            if not present:
                continue
            moved = [f"{m} {verdicts[m]}" + "".join(
                f" {r.delta_pct:+.1f}% at C={r.concurrency}" for r in self.rows
                if r.metric == m and r.verdict in ("improved", "regressed") and r.delta_pct is not None)
                for m in present]
            family_verdicts = {verdicts[m] for m in present}
            word = ("mixed" if {"improved", "regressed"} <= family_verdicts or "mixed" in family_verdicts
                    else next((v for v in ("regressed", "improved", "inconclusive") if v in family_verdicts),
                              "no-change"))
            parts.append(f"{family} {word} ({'; '.join(moved)})")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {
            "old": self.old_id, "new": self.new_id, "comparable": self.comparable,
            "apis": {"old": self.apis[0], "new": self.apis[1]},
            "differences": self.differences, "ignored": self.ignored, "info": self.info,
            "rows": [r.to_dict() for r in self.rows], "regressions": len(self.regressions),
            "metric_verdicts": self.metric_verdicts(), "outcome": self.outcome, "summary": self.summary(),
            "concurrency_outcomes": {str(c): v for c, v in self.concurrency_outcomes().items()},
            "min_repetitions": MIN_REPETITIONS,
        }


def _get(record: dict, path: tuple[str, str]):
    return (record.get(path[0]) or {}).get(path[1])


#: Dicts (and one argv list) of a record compared field by field for ``records compare``.
DIFFED_SECTIONS = (("server", "resolved_args"), ("software", "server_env"), ("software", "kernel_flags"),
                   ("server", "launch_args"))


def _options(argv) -> dict:
    """``--name value`` / ``--flag`` / ``--name=value`` of an argv list as {name: value or True}."""
    out: dict = {}
    items = list(argv or [])
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.startswith("--"):
            continue
        if "=" in item:
            name, value = item.split("=", 1)
            out[name] = value
        elif i + 1 < len(items) and not str(items[i + 1]).startswith("--"):
            out[item] = items[i + 1]
        else:
            out[item] = True
    return out


def field_differences(old: dict, new: dict) -> list[dict]:
    """Field-level differences of the server arguments, the server environment and the kernel
    flags (``server.resolved_args.<name>``, ``software.server_env.<NAME>``, ``server.launch_args.--opt``):
    what the hashes in INFO_FIELDS only say differ."""
    out = []
    for section, name in DIFFED_SECTIONS:
        a, b = _get(old, (section, name)), _get(new, (section, name))
        if name == "launch_args":
            a, b = _options(a), _options(b)
        if not isinstance(a, dict) or not isinstance(b, dict) or a == b:
            continue
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                out.append({"field": f"{section}.{name}.{key}", "old": a.get(key), "new": b.get(key)})
    return out


def key_differences(old: dict, new: dict, ignore: Iterable[str] = ()) -> list[dict]:
    ignore = set(ignore)
    k_old, k_new = comparability_key(old), comparability_key(new)
    # An unknown value (kernel flags the record could not read) matches nothing, not even itself.
    return [{"field": f, "old": k_old.get(f), "new": k_new.get(f)}
            for f in KEY_FIELDS if f not in ignore and (k_old.get(f) != k_new.get(f) or is_unknown(k_old.get(f)))]


def _values(record: dict, metric: str, concurrency: int) -> list[float]:
    out = []
    for point in record["points"]:
        if int(point["max_concurrency"]) == concurrency and point["validity"]["passed"]:
            value = metric_value(point, metric)
            if value is not None:
                out.append(float(value))
    return out


def verdict_for(metric: str, concurrency: int, old: list[float], new: list[float]) -> Row:
    direction = METRICS.get(metric, ("higher", metric))[0]
    floor = noise_floor(metric, concurrency)
    if not old or not new:
        return Row(metric, concurrency, len(old), len(new), stats.mean(old) if old else None,
                   stats.mean(new) if new else None, None, None, None, "invalid")
    m_old, m_new = stats.mean(old), stats.mean(new)
    if m_old == 0:
        return Row(metric, concurrency, len(old), len(new), m_old, m_new, None, None, None, "inconclusive")
    delta = (m_new - m_old) / abs(m_old)
    cv = stats.pooled_cv(old, new) or 0.0
    threshold = max(floor, K_CV * cv)
    ci = stats.welch_diff_ci95(old, new)
    ci_pct = (100 * ci[0] / abs(m_old), 100 * ci[1] / abs(m_old)) if ci else None
    better = delta > 0 if direction == "higher" else delta < 0
    if min(len(old), len(new)) < MIN_REPETITIONS:
        verdict = "inconclusive"  # too few repetitions to tell anything from noise
    elif ci is None:
        verdict = "no-change" if abs(delta) <= floor else "inconclusive"
    elif abs(delta) <= threshold:
        # A "no change" claim needs noise small enough to have seen a floor-sized change.
        verdict = "no-change" if K_CV * cv <= floor else "inconclusive"
    elif ci[0] > 0 or ci[1] < 0:
        verdict = "improved" if better else "regressed"
    else:
        verdict = "inconclusive"
    return Row(metric, concurrency, len(old), len(new), m_old, m_new, 100 * delta, ci_pct,
               100 * (threshold if ci is not None else floor), verdict)


def compare(old: dict, new: dict, *, ignore: Iterable[str] = (), metrics: Iterable[str] = tuple(METRICS)) -> Comparison:
    """B (``new``) against A (``old``). ValueError for an unknown ``ignore`` field, and for a record
    holding both arms of an A/B sweep: its arms are never pooled (``select_arm`` picks one)."""
    for record in (old, new):
        if len(arms_of(record)) > 1:
            raise ValueError(f"{record['run_id']} is an A/B record with arms {', '.join(arms_of(record))}: its arms "
                             f"are never pooled; name one arm, e.g. {record['run_id']}@A")
    ignore = sorted(set(ignore))
    unknown = [f for f in ignore if f not in KEY_FIELDS]
    if unknown:
        raise ValueError(f"unknown comparability field(s) {unknown}; known: {', '.join(KEY_FIELDS)}")
    if "api" in ignore:
        raise ValueError("api cannot be ignored: a /generate sweep and a chat sweep measure different routes "
                         "(prompt form, template, parsers) and are never compared")
    result = Comparison(old_id=old["run_id"], new_id=new["run_id"], comparable=True, ignored=ignore,
                        apis=(record_api(old), record_api(new)))
    result.differences = key_differences(old, new, ignore)
    for path in INFO_FIELDS:
        a, b = _get(old, path), _get(new, path)
        if a != b:
            result.info.append({"field": ".".join(path), "old": a, "new": b})
    result.info.extend(field_differences(old, new))
    if result.differences:
        result.comparable = False
        return result
    concurrencies = sorted({int(p["max_concurrency"]) for p in old["points"]} |
                           {int(p["max_concurrency"]) for p in new["points"]})
    for c in concurrencies:
        bad = [f"{side}: {_invalid_at(record, c)}" for side, record in (("old", old), ("new", new))
               if _invalid_at(record, c)]
        if bad:
            result.invalid_detail[c] = "; ".join(bad)
    for metric in metrics:
        values = {c: (_values(old, metric, c), _values(new, metric, c)) for c in concurrencies}
        if not any(a or b for a, b in values.values()):
            continue  # neither record measured it (e.g. no SLOs, so no goodput)
        for c in concurrencies:
            row = verdict_for(metric, c, *values[c])
            if c in result.invalid_detail:
                row.verdict = "invalid"  # an invalid repetition (or a missing C) makes the concurrency invalid
                row.cause = result.invalid_detail[c]
            else:
                _word_cause(row, _valid_count(old, c), _valid_count(new, c))
            result.rows.append(row)
    return result


def _valid_count(record: dict, concurrency: int) -> int:
    return sum(1 for p in record["points"] if int(p["max_concurrency"]) == concurrency and p["validity"]["passed"])


def _word_cause(row: Row, old_valid: int, new_valid: int) -> None:
    """Every point at this concurrency is valid: name why a verdict is inconclusive. A valid point
    without the metric's value is never called invalid, and valid repetitions are counted as such."""
    missing = [f"{side} side: {valid - n} of {valid} valid repetitions have no {row.metric}"
               for side, n, valid in (("old", row.old_n, old_valid), ("new", row.new_n, new_valid)) if n < valid]
    few = [f"{side} side: {valid} valid repetition(s)" for side, valid in (("old", old_valid), ("new", new_valid))
           if valid < MIN_REPETITIONS]
    if row.verdict == "invalid":  # no value on a side, though its points are valid
        row.verdict = "inconclusive"
    if missing:
        row.cause = "; ".join(missing)
    elif few and row.verdict == "inconclusive":
        row.cause = "; ".join(few) + f" (a verdict needs {MIN_REPETITIONS}; run with --repeat {MIN_REPETITIONS} or more)"
    elif row.verdict == "inconclusive":
        row.cause = "the change is within the noise of these repetitions"


def _invalid_at(record: dict, concurrency: int) -> Optional[str]:
    """Why ``record`` has no clean result at ``concurrency``, in words; None when every point is valid."""
    points = [p for p in record["points"] if int(p["max_concurrency"]) == concurrency]
    if not points:
        return f"no point at C={concurrency}"
    bad = [p for p in points if not p["validity"]["passed"]]
    if not bad:
        return None
    gates = sorted({g for p in bad for g in p["validity"].get("failed") or ()})
    return f"{len(bad)} of {len(points)} repetitions invalid ({', '.join(gates)})"


def arms_of(record: dict) -> list[str]:
    """The A/B arms whose points ``record`` holds ([] for a plain sweep)."""
    return sorted({p["arm"] for p in record.get("points") or () if p.get("arm")})


def select_arm(record: dict, arm: str) -> dict:
    """One arm of an A/B record as a record of its own (its points, its own provenance when the
    record kept it): what ``records compare ID@A`` compares. ValueError for an arm it lacks."""
    arms = arms_of(record)
    if arm not in arms:
        raise ValueError(f"{record.get('run_id')} has no arm {arm!r} (its arms: {', '.join(arms) or 'none'})")
    side = dict(record, run_id=f"{record['run_id']}@{arm}", points=[p for p in record["points"] if p.get("arm") == arm])
    side.update(((record.get("ab") or {}).get("provenance") or {}).get(arm) or {})
    side.pop("ab", None)
    return side


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_comparison(result: Comparison) -> str:
    lines = [f"old: {result.old_id} (API {result.apis[0]})", f"new: {result.new_id} (API {result.apis[1]})"]
    if result.ignored:
        lines.append(f"allowed to differ: {', '.join(result.ignored)}")
    if not result.comparable:
        lines.append("NOT COMPARABLE: no verdict. These comparability fields differ:")
        for d in result.differences:
            lines.append(f"  {d['field']}: {d['old']!r} -> {d['new']!r}")
        lines.append("(pass --ignore FIELD to compare anyway when the difference is the point, e.g. context_length)")
    for d in result.info:
        lines.append(f"note: {d['field']} differs: {str(d['old'])[:60]} -> {str(d['new'])[:60]}")
    if result.rows:
        header = f"{'metric':<18} {'C':>4} {'old':>11} {'new':>11} {'Δ%':>8} {'95% CI of Δ%':>19} {'thresh%':>7}  verdict"
        lines += ["", header, "-" * len(header)]
        for r in result.rows:
            ci = f"[{_fmt(r.ci_pct[0], 1)}, {_fmt(r.ci_pct[1], 1)}]" if r.ci_pct else "n<2"
            lines.append(
                f"{r.metric:<18} {r.concurrency:>4} {_fmt(r.old_mean):>11} {_fmt(r.new_mean):>11} "
                f"{_fmt(r.delta_pct, 1):>8} {ci:>19} {_fmt(r.threshold_pct, 1):>7}  {r.verdict}"
            )
        lines.append("")
        lines.append(f"summary: {result.summary()}")
        causes: dict = {}
        for r in result.rows:
            if r.cause and r.verdict in ("invalid", "inconclusive"):
                causes.setdefault((r.concurrency, r.verdict, r.cause), []).append(r.metric)
        for (c, verdict, cause), names in causes.items():
            lines.append(f"C={c} {verdict} ({', '.join(names)}): {cause}")
        lines.append({"invalid": "INVALID: a concurrency has invalid or missing points (listed above); no verdict "
                                 "there, and this is not a pass",
                      "regressed": f"{len(result.regressions)} regression(s)",
                      "inconclusive": "INCONCLUSIVE: no regression found, but not every metric could be told "
                                      "from the noise (this is not a pass)",
                      "ok": "no regression"}[result.outcome])
    return "\n".join(lines)
