"""What ``dsv4kit bench`` does, as plain functions: check, baseline, sweep, publish, exit policy.

``plan`` makes every check that needs no box (arguments, results repository, inventory, baseline
and its comparability) and raises ``Abort`` naming the problem; ``execute`` connects, runs the
sweep and publishes it (a sweep that stopped after some points is published as incomplete);
``exit_code`` and ``summary`` turn the outcome into the command's exit code and ``--json``.
The command (``dsv4kit.commands.bench``) only parses and prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from dsv4kit.bench import assembly, config, spill, sweep
from dsv4kit.core import exitcodes, host_limits
from dsv4kit.core.exitcodes import Abort
from dsv4kit.records import results_repo
from dsv4kit.records.compare import compare, key_differences
from dsv4kit.records.record import RecordError
from dsv4kit.serving import arms

if TYPE_CHECKING:
    from dsv4kit.core.inventory import Host
    from dsv4kit.records.compare import Comparison

Say = Callable[[str], None]


@dataclass
class BenchRequest:
    """The sweep as the user asked for it, in the CLI's own terms (None: the documented default).
    Where a field is also the sweep's, its default is ``config.SweepConfig``'s (one place)."""

    ctx: int
    concurrency: str = "1,16,64"
    input_len: Optional[int] = None
    output_len: Optional[int] = None
    repeat: int = config.SweepConfig.repeat
    num_prompts: Optional[int] = None
    warmup_requests: Optional[int] = None
    seed: int = config.SweepConfig.seed
    host: Optional[str] = None
    inventory: Optional[Path] = None
    baseline: Optional[str] = None
    baseline_ctx: Optional[int] = None
    results_repo: Optional[Path] = None
    point_timeout: float = config.SweepConfig.point_timeout_s
    server_timeout: float = config.SweepConfig.server_timeout_s
    metrics_interval: float = config.SweepConfig.metrics_interval_s
    restart: bool = config.SweepConfig.restart
    min_concurrency_ratio: float = config.GateConfig.min_concurrency_ratio
    ratio_given: bool = False  # --min-concurrency-ratio given explicitly (check_prompts words its message so)
    max_cache_hit_pct: float = config.GateConfig.max_cache_hit_pct
    retok_tolerance: float = config.GateConfig.retok_tolerance
    ab: Optional[str] = None
    restarts: int = config.SweepConfig.restarts
    idle_timeout: float = config.GateConfig.idle_timeout_s
    trust_new_host_key: bool = False
    verbose: bool = False
    #: ``--prefill``: cold prefill tokens/s at ``prefill_lengths`` (None: the default lengths).
    prefill: bool = False
    prefill_lengths: Optional[str] = None
    #: ``--api``: ``generate`` (SGLang's native route) or ``chat`` (``dsv4kit.bench.api``).
    api: str = config.SweepConfig.api
    #: ``--profile``: called after the last point (``dsv4kit.profile.run.bench_hook``), its result
    #: goes into the record as ``profile``.
    profile_hook: Optional[Callable] = None


@dataclass
class BenchPlan:
    """A request that passed every check made before connecting."""

    request: BenchRequest
    cfg: config.SweepConfig
    target: "Host"
    inventory_path: Path
    repo: Path
    ab_spec: Optional[arms.ABSpec] = None
    baseline: Optional[dict] = None
    ignore: tuple[str, ...] = ()  # comparability-key fields a --baseline-ctx comparison may differ in


@dataclass
class BenchOutcome:
    result: assembly.SweepResult
    published: results_repo.Published
    comparison: Optional["Comparison"]
    exit_code: int


def baseline_problem(record: dict) -> Optional[str]:
    """Why ``record`` may not serve as a baseline (None: it may): an invalid point or an incomplete sweep."""
    if record.get("incomplete"):
        return "incomplete: the sweep stopped before its last point"
    if record.get("ab"):
        return "an A/B record (two arms in one record); compare its arms with `dsv4kit records show`"
    if not record.get("validity_passed"):
        return f"{record.get('invalid_points')} invalid point(s)"
    return None


def find_baseline(repo: Path, host_name: str, context_length: int) -> dict:
    """The newest valid, complete record of ``host_name`` at ``context_length``; Abort(USAGE) if none."""
    if not repo.exists():
        raise Abort(exitcodes.USAGE, f"--baseline-ctx: results repository {str(repo)!r} does not exist yet")
    prefix = f"{config.safe_name(host_name)}-ctx{context_length}-"
    entries = [e for e in results_repo.list_records(repo) if e.run_id.startswith(prefix)]
    if not entries:
        raise Abort(exitcodes.USAGE, f"--baseline-ctx {context_length}: no record for host {host_name!r} at context "
                                     f"length {context_length} in {repo} (run `dsv4kit bench --ctx {context_length}` first)")
    skipped = []
    for entry in reversed(entries):
        record = results_repo.read_entry(repo, entry)
        reason = baseline_problem(record)
        if reason is None:
            return record
        skipped.append(f"{entry.run_id} ({reason})")
    raise Abort(exitcodes.USAGE, f"--baseline-ctx {context_length}: no valid record for host {host_name!r} at context "
                                 f"length {context_length} in {repo}; only valid records serve as baselines, and these "
                                 f"are not: {', '.join(skipped)}")


def _ab_spec(req: BenchRequest, warn: Say):
    if req.baseline and req.baseline_ctx is not None:
        raise Abort(exitcodes.USAGE, "give --baseline or --baseline-ctx, not both")
    if req.ab is None:
        return None
    if req.baseline or req.baseline_ctx is not None:
        raise Abort(exitcodes.USAGE, "--ab compares its two arms with each other; it takes no --baseline/--baseline-ctx")
    spec = arms.parse_ab(req.ab)
    if req.repeat < 3:
        warn(f"warning: --ab with --repeat {req.repeat}: a verdict needs at least 3 valid repetitions per arm, "
             f"so this will be inconclusive (exit 7)")
    return spec


def _target(req: BenchRequest, inventory_path: Path, ab_spec, warn: Say):
    from dsv4kit.core.inventory import InventoryError, load_inventory
    from dsv4kit.provision import playbook

    try:
        target = load_inventory(inventory_path).host(req.host)
        config.check_host(target)
        host_limits.check_context(target, req.ctx)
        host_limits.check_concurrency(target, config.parse_concurrency(req.concurrency))
        if ab_spec is not None:
            try:  # every arm restarts the serving units through the playbook
                playbook.check_tags(playbook.check_tools(),
                                    tags=arms.arm_extra_vars(target, req.ctx, ab_spec, "A")[0])
            except playbook.ProvisionError as exc:
                raise Abort(exc.exit_code, f"--ab restarts the serving units for every arm: {exc}") from None
        if req.restart:
            warning = config.check_restart_tools(target, req.ctx)
            if warning:
                warn(f"warning: {warning}")
    except InventoryError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None
    return target


def _baseline(req: BenchRequest, repo: Path, target, cfg) -> tuple[Optional[dict], tuple[str, ...]]:
    old, ignore = None, ()
    try:
        if req.baseline:
            old = results_repo.read_record(repo, req.baseline)
            problem = baseline_problem(old)
            if problem:
                raise Abort(exitcodes.USAGE, f"baseline {old['run_id']} cannot serve as a baseline: {problem}; only "
                                             f"valid records serve as baselines")
        elif req.baseline_ctx is not None:
            old = find_baseline(repo, target.name, req.baseline_ctx)
            ignore = ("context_length",)
    except (RecordError, results_repo.ResultsRepoError) as exc:
        raise Abort(exitcodes.USAGE, f"baseline: {exc}") from None
    if old is not None:
        differences = key_differences(old, config.planned_record(cfg, target), ignore=(*ignore, *config.BOX_KEY_FIELDS))
        if differences:
            hint = (" With --baseline-ctx give --input-len and --output-len that fit both context lengths "
                    "(the default input length is --ctx minus 1024)." if ignore else "")
            raise Abort(exitcodes.USAGE, f"baseline {old['run_id']} is not comparable with this sweep, so nothing was "
                                         "run: " + "; ".join(f"{d['field']} {d['old']!r} there, {d['new']!r} here"
                                                             for d in differences) + "." + hint)
    return old, ignore


def plan(req: BenchRequest, warn: Say) -> BenchPlan:
    """Every check that needs no box, in the order the user meets them; Abort naming the first problem."""
    from dsv4kit.core.inventory import default_inventory_path
    from dsv4kit.core.paths import results_repo_or_default

    repo = results_repo_or_default(req.results_repo)
    inventory_path = req.inventory or default_inventory_path()
    cfg = config.from_request(req)
    ab_spec = _ab_spec(req, warn)
    results_repo.check_option(repo)  # before the sweep: a bad path must not cost a sweep
    try:
        spill.check_free_space([repo, spill.default_spill_root()])
    except config.BenchAbort as exc:
        raise Abort(exc.exit_code, str(exc)) from None
    target = _target(req, inventory_path, ab_spec, warn)
    old, ignore = _baseline(req, repo, target, cfg)
    return BenchPlan(request=req, cfg=cfg, target=target, inventory_path=inventory_path, repo=repo,
                     ab_spec=ab_spec, baseline=old, ignore=ignore)


def publish(p: BenchPlan, result) -> "results_repo.Published":
    """One commit and one annotated tag for ``result`` in the plan's results repository."""
    cfg, record = p.cfg, result.record
    return results_repo.publish(p.repo, run_id=result.run_id, tag=result.tag, files=result.files(),
                                message=f"bench {result.run_id}\n\nhost {p.target.name}, context length "
                                        f"{cfg.context_length}, concurrency {cfg.concurrency}, {cfg.input_len}/"
                                        f"{cfg.output_len} tokens, {cfg.repeat} repetition(s); valid: "
                                        f"{record['validity_passed']}"
                                        + ("; INCOMPLETE" if record.get("incomplete") else ""))


def publish_partial(p: BenchPlan, exc: Exception, spill_root: Path) -> str:
    """A sweep that stopped after some points: publish them as an incomplete record; what happened, in words."""
    partial = getattr(exc, "partial", None)
    if partial is None:
        return "nothing was recorded"
    spilled = spill_root / partial.run_id
    try:
        published = publish(p, partial)
    except (results_repo.ResultsRepoError, KeyboardInterrupt) as publish_error:
        return (f"the {len(partial.record['points'])} completed point(s) could not be published "
                f"({publish_error}); they are kept in {spilled} (`dsv4kit records publish {spilled}` publishes them)")
    spill.Spill(spilled).remove()
    return (f"the {len(partial.record['points'])} completed point(s) were recorded as INCOMPLETE record "
            f"{partial.run_id} (tag {published.tag}); it never serves as a baseline")


def exit_code(record: dict, comparison, ab_spec) -> int:
    """0 ok; 1 an invalid point, a regression, a baseline not comparable on a box fact, or a
    ``--max-class-share`` breach of the record's profile; 7 inconclusive.

    An inconclusive comparison is never a pass, and never masks an invalid point or a regression.
    """
    code = exitcodes.OK
    if not record["validity_passed"] or (comparison is not None and comparison.outcome in ("regressed",
                                                                                          "not-comparable")):
        code = exitcodes.CHECK_FAILED
    elif comparison is not None and comparison.outcome == "inconclusive":
        code = exitcodes.INCONCLUSIVE
    if code == exitcodes.OK and ((record.get("profile") or {}).get("gate") or {}).get("breaches"):
        code = exitcodes.CHECK_FAILED  # bench --profile --max-class-share
    if ab_spec is not None and code == exitcodes.OK:
        code = {"invalid": exitcodes.CHECK_FAILED, "regressed": exitcodes.CHECK_FAILED,
                "inconclusive": exitcodes.INCONCLUSIVE}.get(record["ab"]["outcome"], exitcodes.OK)
    return code


def _kept(interrupt: KeyboardInterrupt) -> str:
    """What a Ctrl-C during the sweep left: the finished points' spill, or nothing (still connecting)."""
    count, where = getattr(interrupt, "points_kept", (0, None))
    if not count or where is None:
        return "no point had finished; nothing was kept"
    return f"{count} finished point(s) are kept in {where}: `dsv4kit records publish {where}` publishes them"


def execute(p: BenchPlan, progress: Say, argv: list[str]) -> BenchOutcome:
    """Connect, sweep, publish, compare. Abort with the sweep's own exit code on failure (with what
    was published of it); Abort(INTERRUPTED) on Ctrl-C, saying what was kept."""
    from dsv4kit.core.inventory import InventoryError
    from dsv4kit.core.ssh import RemoteError, open_session
    from dsv4kit.monitor.textfile import publish_record

    repo, spill_root = p.repo, spill.default_spill_root()
    try:
        with open_session(p.target, trust_new_host_key=p.request.trust_new_host_key, say=progress) as session:
            result = sweep.run_sweep(p.cfg, host=p.target, session=session, inventory_path=p.inventory_path,
                                     progress=progress, argv=argv, spill_root=spill_root, ab=p.ab_spec,
                                     profile=p.request.profile_hook)
            record = result.record
            publish_record(session, p.target, "bench", record, "incomplete" if record.get("incomplete") else
                           "valid" if record.get("validity_passed") else "invalid", progress)
    except KeyboardInterrupt as exc:
        raise Abort(exitcodes.INTERRUPTED, f"interrupted: the sweep was stopped; nothing was recorded in {repo} "
                                           f"({_kept(exc)})") from None
    except config.BenchAbort as exc:
        raise Abort(exc.exit_code, f"{exc}\n{publish_partial(p, exc, spill_root)}") from None
    except RemoteError as exc:
        raise Abort(exc.exit_code, f"{exc} (sweep aborted; {publish_partial(p, exc, spill_root)})") from None
    except InventoryError as exc:
        raise Abort(exitcodes.USAGE, str(exc)) from None

    spilled = spill_root / result.run_id
    try:
        published = publish(p, result)
    except KeyboardInterrupt:
        raise Abort(exitcodes.INTERRUPTED, f"interrupted before the record was published; nothing was recorded in "
                                           f"{repo} (the sweep is kept in {spilled})") from None
    except results_repo.ResultsRepoError as exc:
        raise Abort(exitcodes.TOOL_FAILED, f"{exc} (nothing was recorded in {repo}; the sweep is kept in "
                                           f"{spilled}: `dsv4kit records publish {spilled}` publishes it)") from None
    spill.Spill(spilled).remove()
    if published.worktree_warning:
        progress(f"warning: {recorded_line(result, published, repo)}, but the work tree of {repo} was not updated "
                 f"(`git -C {repo} reset --hard` brings it along): {published.worktree_warning}")
    if published.interrupted:
        progress(recorded_line(result, published, repo))
        raise Abort(exitcodes.INTERRUPTED, "interrupted after the record was committed: it is published and complete "
                                           "(the summary and any comparison were skipped)")
    comparison = compare(p.baseline, result.record, ignore=p.ignore) if p.baseline is not None else None
    return BenchOutcome(result=result, published=published, comparison=comparison,
                        exit_code=exit_code(result.record, comparison, p.ab_spec))


def recorded_line(result, published, repo: Path) -> str:
    return f"recorded {result.run_id}: commit {published.commit[:12]}, tag {published.tag} in {repo}"


def summary(p: BenchPlan, outcome: BenchOutcome) -> dict:
    """The ``--json`` summary of a published sweep."""
    result, record = outcome.result, outcome.result.record
    return {
        "run_id": result.run_id, "tag": outcome.published.tag, "commit": outcome.published.commit,
        "results_repo": str(p.repo), "record_path": f"records/{result.run_id}/record.json",
        "validity_passed": record["validity_passed"], "invalid_points": record["invalid_points"],
        "points": [{"max_concurrency": pt["max_concurrency"], "repetition": pt["repetition"],
                    "valid": pt["validity"]["passed"], "failed_gates": pt["validity"]["failed"],
                    "decode_tok_s": pt["derived"]["decode_tok_s"],
                    "forward_passes_per_s": pt["derived"].get("forward_passes_per_s"),
                    "acceptance_length": pt["derived"].get("acceptance_length"), "arm": pt.get("arm")}
                   for pt in record["points"]],
        "prefill": record.get("prefill"),
        "summary": record["summary"],
        "comparison": outcome.comparison.to_dict() if outcome.comparison is not None else None,
        "ab": record.get("ab"),
        "retention": retention(p.baseline, record) if p.request.baseline_ctx is not None else None,
        "profile": record.get("profile"),
        "exit_code": outcome.exit_code,
    }


def retention(baseline: dict, record: dict) -> dict:
    """Per concurrency: mean decode tok/s of ``record`` over the baseline's (``--baseline-ctx``:
    the throughput kept at this context against the other one); None where a side has no value."""
    def means(r: dict) -> dict:
        return {str(c): (e.get("decode_tok_s") or {}).get("mean")
                for c, e in (r.get("summary") or {}).get("per_concurrency", {}).items()}

    old, new = means(baseline), means(record)
    return {c: (round(new[c] / old[c], 4) if new.get(c) and old.get(c) else None) for c in new}


def format_retention(baseline: dict, record: dict) -> str:
    """The ``--baseline-ctx`` retention line of the summary."""
    parts = [f"C={c} {100 * v:.1f}%" if v is not None else f"C={c} -" for c, v in retention(baseline, record).items()]
    return (f"throughput retention at context {record['server']['context_length']} against "
            f"{baseline['server']['context_length']} (decode tok/s, this run over {baseline['run_id']}): "
            + ", ".join(parts))
