"""Publish a sweep kept in a spill directory (``dsv4kit records publish DIR``).

A sweep spills every finished point at once (``dsv4kit.bench.sweep.Spill``): ``record.json``
when it finished, else ``record.partial.json`` (the incomplete record so far), and the gzipped
per-point details under ``details/``. When publishing failed (a full disk, a repository that
could not be written) the directory is kept; this publishes it later, as the same one commit
and tag the bench would have made, and removes it afterwards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dsv4kit.core import exitcodes
from dsv4kit.records import results_repo
from dsv4kit.records.record import RecordError, check

FINAL = "record.json"
PARTIAL = "record.partial.json"


class SpillPublishError(exitcodes.Abort):
    """The spill cannot be published (message says why; ``exit_code`` from dsv4kit.core.exitcodes)."""


def read_spill(directory: Path) -> tuple[dict, dict[str, bytes]]:
    """(record, repository files) of a spill directory; SpillPublishError(USAGE) when it holds none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SpillPublishError(exitcodes.USAGE, f"{directory} is not a directory (give a spill directory, named "
                                                 f"by the sweep's run id)")
    source = next((directory / n for n in (FINAL, PARTIAL) if (directory / n).is_file()), None)
    if source is None:
        raise SpillPublishError(exitcodes.USAGE, f"{directory} holds no {FINAL} or {PARTIAL}: not a kept spill")
    try:
        record = check(json.loads(source.read_text()), str(source))
    except (ValueError, RecordError) as exc:
        raise SpillPublishError(exitcodes.USAGE, f"{source}: {exc}") from None
    if source.name == PARTIAL:
        record = _with_spilled_points(directory, record)
        record = dict(record, incomplete=True, validity_passed=False,
                      incomplete_reason=f"the sweep did not finish; its {len(record['points'])} finished point(s) "
                                        f"were published from its spill")
    base = f"{results_repo.RECORDS_DIR}/{record['run_id']}"
    from dsv4kit.records.record import dumps

    files = {f"{base}/{FINAL}": dumps(record).encode()}
    wanted = {p.get("details_file") for p in record["points"]} - {None}
    for name in sorted(wanted):
        path = directory / name
        if path.is_file():
            files[f"{base}/{name}"] = path.read_bytes()
    return record, files


def _point_key(point: dict) -> tuple:
    return (point.get("max_concurrency"), point.get("repetition"), point.get("arm"))


def _with_spilled_points(directory: Path, record: dict) -> dict:
    """The partial record plus the finished points whose own file was written after it (a write of
    ``record.partial.json`` that failed after the point's file: a full disk): no finished point is lost."""
    from dsv4kit.records.record import summarize_points

    have = {_point_key(p) for p in record["points"]}
    extra = []
    for path in sorted(directory.glob("point-*.json")):
        try:
            point = json.loads(path.read_text())
        except ValueError:
            continue  # a point file is written whole or not at all (write_durably); this is not ours
        if isinstance(point, dict) and "validity" in point and _point_key(point) not in have:
            extra.append(point)
            have.add(_point_key(point))
    if not extra:
        return record
    points = list(record["points"]) + extra
    invalid = sum(1 for p in points if not p["validity"]["passed"])
    return dict(record, points=points, invalid_points=invalid,
                summary=summarize_points(points) if not record.get("ab") else record["summary"])


def publish_spill(directory: Path, repo: Path):
    """Publish the spill in ``directory`` into ``repo``; returns (Published, record). A spill whose
    record is already published (a bench killed after its commit) is removed, and ``Published.already``
    says so: nothing is committed twice."""
    record, files = read_spill(directory)
    if not record["points"]:
        shutil.rmtree(directory, ignore_errors=True)
        raise SpillPublishError(exitcodes.USAGE, f"{directory} held a sweep that stopped before its first point "
                                                 f"finished: there is nothing to publish, and the spill was removed")
    try:
        results_repo.check_writable(repo)
    except results_repo.GitNotFound as exc:
        raise SpillPublishError(exitcodes.ENVIRONMENT, f"{exc} (the spill is kept in {directory})") from None
    except results_repo.ResultsRepoError as exc:
        raise SpillPublishError(exitcodes.USAGE, f"--results-repo: {exc} (the spill is kept in {directory})") from None
    try:
        commit = results_repo.published_as(Path(repo), record["run_id"], record["tag"])
        if commit is not None:
            results_repo.catch_up(Path(repo))
    except results_repo.ResultsRepoError as exc:
        raise SpillPublishError(exitcodes.TOOL_FAILED, f"{exc} (the spill is kept in {directory})") from None
    if commit is not None:
        shutil.rmtree(directory, ignore_errors=True)
        return results_repo.Published(commit=commit, tag=record["tag"], run_id=record["run_id"],
                                      paths=sorted(files), already=True), record
    try:
        published = results_repo.publish(repo, run_id=record["run_id"], tag=record["tag"], files=files,
                                         message=f"bench {record['run_id']} (published from its spill)\n\n"
                                                 f"valid: {record['validity_passed']}"
                                                 + ("; INCOMPLETE" if record.get("incomplete") else ""))
    except results_repo.ResultsRepoError as exc:
        raise SpillPublishError(exitcodes.TOOL_FAILED, f"{exc} (the spill is kept in {directory})") from None
    shutil.rmtree(directory, ignore_errors=True)
    return published, record
