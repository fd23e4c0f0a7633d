"""Every state a failed or killed publish can leave is published, or cleared saying where the record is.

Both tests find the steps by counting them in a clean run first, so a write added later is
covered without touching the tests:

* every file write of the bench's spill and of the publish path (Python's own writes, and every
  git invocation that is not a known read) fails in turn with ENOSPC;
* ``dsv4kit records publish`` is SIGKILLed before each git write and after the last one (a
  ``git`` wrapper first on PATH kills its parent).
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import re
import shutil
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

from tests.cli_support import invoke

from dsv4kit.records import results_repo
from tests.bench_support import publish_record, synthetic_record

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = "lo-ctx4096-20260101T000100Z-bbbbbb"
#: git subcommands that only read; any other invocation counts as a write.
READS = {"rev-parse", "symbolic-ref", "config", "var", "ls-tree", "cat-file", "merge-base", "check-ref-format",
         "diff-files", "describe", "show", "for-each-ref", "log", "status", "fsck"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def subcommand(args) -> str:
    args = list(args)
    while args and args[0] == "-C":
        args = args[2:]
    return args[0] if args else ""


def assert_consistent(repo: Path, run_ids: list, clean: bool = True, fsck: bool = True) -> list:
    """The repository holds exactly ``run_ids`` (None: any one), one commit and one tag each, on main,
    and git is happy; returns its entries."""
    if fsck:
        assert subprocess.run(["git", "-C", str(repo), "fsck", "--no-dangling"], capture_output=True).returncode == 0
    entries = results_repo.list_records(repo)
    assert [e.run_id if i is not None else None for e, i in zip(entries, run_ids)] == run_ids, entries
    assert len(entries) == len(run_ids) and all(e.tag for e in entries), entries
    assert len(git(repo, "tag", "-l").split()) == len(run_ids) == int(git(repo, "rev-list", "--count", "main"))
    assert not list((repo / ".git").rglob("*.lock"))
    if clean:
        assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    return entries


def template_repo(tmp_path: Path) -> tuple[Path, str]:
    """A results repository with one record (copied for each case), and that record's run id."""
    repo = tmp_path / "template"
    first = synthetic_record("lo-ctx4096-20260101T000000Z-aaaaaa", {1: [100.0]})
    publish_record(repo, first)
    return repo, first["run_id"]


# ----------------------------------------------------------------------------- (a) ENOSPC
class Writes:
    """Counts the writes of the code under test and fails the ``fail_at``-th with ENOSPC: Python's
    own (open for writing, os.open for writing, fsync, replace/rename, mkdir of a new directory) and every git
    invocation that is not a read (it fails as git does on a full disk, without running)."""

    def __init__(self, monkeypatch, fail_at: int = 0):
        self.count, self.fail_at, self.log = 0, fail_at, []
        self.mp = monkeypatch
        real_open, real_os_open, real_git = builtins.open, os.open, results_repo._git

        def hit(what: str) -> bool:
            self.count += 1
            self.log.append(what)
            return self.count == self.fail_at

        def enospc(what: str):
            return OSError(errno.ENOSPC, f"No space left on device (injected at write {self.count}: {what})")

        def opened(file, mode="r", *a, **kw):
            if not isinstance(file, int) and any(c in mode for c in "wax+") and hit(f"open {file}"):
                raise enospc(f"open {file}")
            return real_open(file, mode, *a, **kw)

        def os_opened(path, flags, *a, **kw):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and hit(f"os.open {path}"):
                raise enospc(f"os.open {path}")
            return real_os_open(path, flags, *a, **kw)

        def wrap(name):
            real = getattr(os, name)

            def call(*a, **kw):
                if not (name == "mkdir" and os.path.isdir(a[0])) and hit(f"{name} {a[0]}"):
                    raise enospc(name)
                return real(*a, **kw)
            return call

        def git_call(repo, *args, **kw):
            if subcommand(args) not in READS and hit(f"git {' '.join(args[:3])}"):
                proc = subprocess.CompletedProcess(args, 128, b"", b"fatal: No space left on device (injected)")
                if kw.get("check", True):
                    raise results_repo.ResultsRepoError(f"git {' '.join(args[:3])} failed in {repo}: fatal: "
                                                        f"No space left on device (injected)")
                return proc
            return real_git(repo, *args, **kw)

        self.patches = [(builtins, "open", opened), (io, "open", opened), (os, "open", os_opened),
                        (results_repo, "_git", git_call)] + [(os, n, wrap(n)) for n in ("fsync", "replace",
                                                                                          "rename", "mkdir")]

    def install(self) -> "Writes":
        for target, name, value in self.patches:
            self.mp.setattr(target, name, value)
        return self


def fake_sweep(monkeypatch, record: dict, kept: list):
    """The real sweep and its spill, with the box replaced: the loop keeps ``record``'s points (with
    their details files); ``kept`` receives the points the sweep finished."""
    from dsv4kit.bench import sweep
    import dsv4kit.core.ssh as ssh

    class Loop(sweep._SweepLoop):
        def prepare(self, restart):
            self.s.first_provenance = {k: record[k] for k in ("host", "gpus", "software", "model", "server")}
            self.s.probe = {"packages": {"sglang": "0.5.23"}}
            self.s.starts = [{"before_repetition": 0, "startup_time": None, "provenance_differs": []}]
            kept.append(self.s.points)

        def run(self, apply_arm, restart_units):
            for point in record["points"]:
                if point["details_file"]:
                    self.s.details[point["details_file"]] = {"ttfts": [0.1], "itls": [[0.01]]}
                self.keep(point, point["details_file"])

    class Remote:
        def __init__(self, *a):
            pass

        setup = cleanup = lambda self: None

    monkeypatch.setattr(sweep, "ServingSession", Remote)
    monkeypatch.setattr(sweep, "_SweepLoop", Loop)
    monkeypatch.setattr(ssh, "open_session", lambda *a, **kw: nullcontext(None))


def bench_then_publish(repo: Path, spill_root: Path, kept: list, bench: bool = True, publish: bool = True) -> list[str]:
    """``dsv4kit bench`` (run.execute) and, when it kept a spill, ``records publish`` of it; what they said."""
    from dsv4kit.bench import config, run
    from dsv4kit.core.exitcodes import Abort
    from dsv4kit.core.inventory import Host

    host = Host(name="lo", groups=[], vars={"dsv4_model_path": "/m", "dsv4_decode_port": 1}, source=Path("inv"))
    plan = run.BenchPlan(request=SimpleNamespace(trust_new_host_key=False, profile_hook=None, baseline_ctx=None),
                         cfg=config.SweepConfig(4096, [1], 16, 8, repeat=2), target=host,
                         inventory_path=Path("inv"), repo=repo)
    said: list[str] = []
    if bench:
        os.environ["DSV4KIT_SPILL_DIR"] = str(spill_root)
        try:
            run.execute(plan, said.append, ["bench"])
        except Abort as exc:
            said.append(f"exit {exc.exit_code}: {exc}")
    for spill in sorted(spill_root.iterdir()) if publish and spill_root.is_dir() else []:
        out = invoke(["records", "publish", str(spill), "--results-repo", str(repo)])
        said.append(f"records publish: exit {out.exit_code}: {out.output}")
    return said


def test_every_write_of_the_spill_and_the_publish_failing_in_turn_leaves_a_publishable_state(tmp_path, monkeypatch):

    template, first = template_repo(tmp_path)
    record = synthetic_record(RUN, {1: [100.0, 101.0]})
    record["points"][1]["details_file"] = None  # one details file is enough, and keeps the count down
    monkeypatch.setenv("DSV4KIT_SPILL_DIR", str(tmp_path / "spill"))
    kept: list = []
    fake_sweep(monkeypatch, record, kept)

    def bench(repo: Path, spill_root: Path) -> list[str]:
        return bench_then_publish(repo, spill_root, kept)

    def publish(repo: Path, spill_root: Path) -> list[str]:
        return bench_then_publish(repo, spill_root, kept, bench=False)

    def case(stage, k: int):
        repo, spill_root = tmp_path / f"repo{k}", tmp_path / "spill"
        shutil.rmtree(spill_root, ignore_errors=True)
        shutil.copytree(template, repo)
        kept.clear()
        if stage is publish:
            shutil.copytree(kept_spill, spill_root / kept_spill.name)
            kept.append(record["points"])
        with monkeypatch.context() as mp:
            writes = Writes(mp, fail_at=k).install()
            said = stage(repo, spill_root)
        return repo, spill_root, writes, said

    # a kept spill as the bench leaves it when publishing fails: for the writes of `records publish`
    def no_room(*args, **kwargs):
        raise results_repo.ResultsRepoError("no room")

    with monkeypatch.context() as mp:
        mp.setattr(results_repo, "publish", no_room)
        said = bench_then_publish(tmp_path / "unused", tmp_path / "kept", kept, publish=False)
    (kept_spill,) = (tmp_path / "kept").iterdir()
    assert (kept_spill / "record.json").is_file() and "the sweep is kept in" in said[-1], said

    for stage in (bench, publish):
        repo, _, counted, said = case(stage, 0)
        assert_consistent(repo, [first, None])
        assert any("update-ref" in w for w in counted.log), counted.log
        if stage is bench:
            # each file written through a temporary: details, both points, the partial record (after
            # the start and after each point) and record.json (as names: an open may also reach
            # os.open, depending on what ran before in the process)
            temps = {re.sub(r"\.\d+\.tmp$", "", Path(w.split(" ", 1)[1]).name)
                     for w in counted.log if "open" in w and w.endswith(".tmp")}
            assert temps == {".c1_r0.json.gz", ".point-c1-r0.json", ".point-c1-r1.json", ".record.json",
                             ".record.partial.json"}, counted.log
        shutil.rmtree(repo)
        for k in range(1, counted.count + 1):
            repo, spill_root, writes, said = case(stage, k)
            what = f"{stage.__name__}: write {k} of {counted.count} ({counted.log[k - 1]}): {said}"
            assert writes.count >= k, what
            spills = list(spill_root.iterdir()) if spill_root.is_dir() else []
            for spill in spills:  # what the failure left, and said it left, published now
                assert any(f"kept in {spill}" in line for line in said), what
                out = invoke(["records", "publish", str(spill), "--results-repo", str(repo)])
                assert out.exit_code == 0 and "tag bench/" in out.output and not spill.exists(), (what, out.output)
            # every finished point is published once, or there was none; the work tree may be a record
            # behind only where we were told so, and the next publish brings it along
            points = kept[0] if kept else []
            behind = any("work tree of" in line and "was not updated" in line for line in said)
            entries = assert_consistent(repo, [first, None] if points else [first], clean=not behind)
            if points:
                published = results_repo.read_entry(repo, entries[1])
                assert [(p["max_concurrency"], p["repetition"]) for p in published["points"]] == \
                       [(p["max_concurrency"], p["repetition"]) for p in points], what
            if behind:
                publish_record(repo, synthetic_record("lo-ctx4096-20991231T000000Z-cccccc", {1: [100.0]}))
                assert_consistent(repo, [first, None, "lo-ctx4096-20991231T000000Z-cccccc"], fsck=False)
            shutil.rmtree(repo)


# ----------------------------------------------------------------------------- (b) SIGKILL
KILLING_GIT = """#!/bin/sh
# Counts its invocations; at the $KILL_AT-th it SIGKILLs its parent (dsv4kit) before or after the real git.
n=$(( $(cat "$GIT_COUNT" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$GIT_COUNT"
printf '%s\n' "$(printf '%s ' "$@" | tr '\n' ' ')" >> "$GIT_LOG"
if [ "$n" = "$KILL_AT" ] && [ "$KILL_WHEN" = before ]; then kill -KILL "$PPID"; exit 137; fi
"$REAL_GIT" "$@"
rc=$?
if [ "$n" = "$KILL_AT" ] && [ "$KILL_WHEN" = after ]; then kill -KILL "$PPID"; fi
exit $rc
"""


def kept_spill(directory: Path, record: dict) -> Path:
    """A spill as a finished sweep leaves it when publishing failed: record.json, a details file, the points."""
    from dsv4kit.bench.assembly import SweepResult
    from dsv4kit.bench.spill import Spill

    spill = Spill(directory / record["run_id"])
    spill.create()
    spill.point(record["points"][0], record["points"][0]["details_file"], {"ttfts": [0.1], "itls": [[0.01]]})
    spill.point(record["points"][1], None, None)
    spill.progress(SweepResult(record=record, details={}))
    spill.finished(SweepResult(record=record, details={}))
    return spill.directory


def test_a_sigkill_at_every_step_of_the_publish_leaves_a_repository_that_publishes_cleanly(tmp_path):

    template, first = template_repo(tmp_path)
    record = synthetic_record(RUN, {1: [100.0, 101.0]})
    record["points"][1]["details_file"] = None
    spill_template = kept_spill(tmp_path / "spill-template", record)
    later = synthetic_record("lo-ctx4096-20991231T000000Z-cccccc", {1: [100.0]})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(KILLING_GIT)
    (bin_dir / "git").chmod(0o755)

    def killed(k: int, when: str) -> tuple[Path, Path, subprocess.CompletedProcess]:
        case = tmp_path / f"{when}{k}"
        repo, spill = case / "results", case / "spill" / RUN
        shutil.copytree(template, repo)
        shutil.copytree(spill_template, spill)
        (case / "tmp").mkdir()  # a killed publish leaves its private index there, not in /tmp
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REAL_GIT": shutil.which("git"),
               "TMPDIR": str(case / "tmp"),
               "GIT_COUNT": str(case / "count"), "GIT_LOG": str(case / "log"), "KILL_AT": str(k), "KILL_WHEN": when}
        proc = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "records", "publish", str(spill),
                               "--results-repo", str(repo)], capture_output=True, text=True, env=env,
                              cwd=REPO_ROOT, timeout=120)
        return repo, spill, proc

    def recovers(repo: Path, spill: Path, what: str) -> None:
        out = invoke(["records", "publish", str(spill), "--results-repo", str(repo)])
        assert out.exit_code == 0 and record["tag"] in out.output and not spill.exists(), (what, out.output)
        assert results_repo.read_record(repo, record["tag"])["run_id"] == RUN, what

    repo, spill, clean = killed(0, "never")
    assert clean.returncode == 0, clean.stderr
    calls = (repo.parent / "log").read_text().splitlines()
    writes = [n for n, line in enumerate(calls, 1) if subcommand(line.split()) not in READS]
    assert any("update-ref" in calls[n - 1] for n in writes), calls
    # before each write, and after the last (the record is committed, the spill not yet removed)
    for k, when in [(n, "before") for n in writes] + [(writes[-1], "after")]:
        repo, spill, proc = killed(k, when)
        what = f"killed {when} git call {k} ({calls[k - 1]})"
        assert proc.returncode == -9, (what, proc.returncode, proc.stderr)
        other = repo.parent.parent / f"{repo.parent.name}-next-first"
        shutil.copytree(repo.parent, other)
        # `records publish` again, then the next bench's publish
        recovers(repo, spill, what)
        assert_consistent(repo, [first, RUN], fsck=False)
        publish_record(repo, later)
        assert_consistent(repo, [first, RUN, later["run_id"]])
        # the next bench's publish first, then `records publish`
        publish_record(other / "results", later)
        recovers(other / "results", other / "spill" / RUN, what + ", the next publish first")
        assert_consistent(other / "results", [first, RUN, later["run_id"]])
