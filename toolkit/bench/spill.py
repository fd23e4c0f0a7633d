"""The local spill of a sweep: every finished point on disk the moment it is done.

``Spill`` writes durably (``write_durably``); ``check_free_space`` refuses a sweep that has no room
for it before connecting. ``dsv4kit records publish DIR`` (``dsv4kit.records.spill_publish``)
publishes a kept spill.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from dsv4kit.bench.config import BenchAbort
from dsv4kit.core import exitcodes
from dsv4kit.core.scrub import scrub
from dsv4kit.records.record import dumps, strict_json

if TYPE_CHECKING:
    from dsv4kit.bench.assembly import SweepResult


def default_spill_root() -> Path:
    """Where finished points are kept until their record is published: ``$DSV4KIT_SPILL_DIR``, else
    ``$XDG_STATE_HOME/dsv4kit/spill`` (``~/.local/state/dsv4kit/spill``)."""
    if os.environ.get("DSV4KIT_SPILL_DIR"):
        return Path(os.environ["DSV4KIT_SPILL_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "dsv4kit" / "spill"


class SpillError(BenchAbort):
    """A finished point could not be written to the spill directory: the sweep stops at once."""


#: A sweep does not start with less free space than this where it spills and publishes
#: (``$DSV4KIT_BENCH_MIN_FREE_MB`` overrides it).
MIN_FREE_MB = 512


def check_free_space(paths, need_mb: Optional[float] = None) -> None:
    """Exit 5 (before connecting) when the file system of any of ``paths`` (or of its nearest
    existing ancestor) has less than ``need_mb`` MiB free."""
    import shutil

    need = float(os.environ.get("DSV4KIT_BENCH_MIN_FREE_MB") or MIN_FREE_MB) if need_mb is None else need_mb
    for path in paths:
        probe = Path(path).absolute()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free / 2**20
        if free < need:
            raise BenchAbort(exitcodes.ENVIRONMENT,
                             f"only {free:.0f} MiB free on the file system of {path} (need {need:.0f} MiB for the "
                             f"spilled points and the record; $DSV4KIT_BENCH_MIN_FREE_MB sets it): nothing was run")


def write_durably(target: Path, data: bytes) -> None:
    """``data`` into ``target``: a sibling temporary file, fsync, rename, fsync of the directory.
    A reader sees the old file or the whole new one; a failure leaves no temporary file behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spill:
    """A local directory holding each finished point the moment it is done (scrubbed, durable
    writes: ``write_durably``): ``point-c<C>-r<R>.json``, ``details/c<C>_r<R>.json.gz`` and
    ``record.partial.json`` (the incomplete record so far) after every point, ``record.json`` when
    the sweep ends. ``dsv4kit records publish DIR`` publishes a kept one. A write that fails raises
    SpillError: the sweep stops, the points written before stay. The caller removes the
    directory once the record is published."""

    from dsv4kit.records.spill_publish import FINAL, PARTIAL

    def __init__(self, directory: Path, warn: Optional[Callable[[str], None]] = None):
        self.directory = directory
        self.warn = warn

    def create(self) -> None:
        """Make the directory; one that exists already is another sweep's (run ids never repeat)."""
        try:
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            self.directory.mkdir()
        except FileExistsError:
            raise BenchAbort(exitcodes.TOOL_FAILED, f"spill directory {self.directory} exists already: another sweep "
                                                    f"has this run id") from None
        except OSError as exc:
            raise SpillError(exitcodes.ENVIRONMENT, f"cannot create the spill directory {self.directory}: {exc}") from None

    def _write(self, name: str, data: bytes) -> None:
        try:
            write_durably(self.directory / name, data)
        except OSError as exc:
            kept = sorted(p.name for p in self.directory.glob("point-*.json")) if self.directory.is_dir() else []
            raise SpillError(exitcodes.ENVIRONMENT,
                             f"cannot spill {name} to {self.directory}: {exc}; the sweep stopped here so that no "
                             f"point is measured without a copy ({len(kept)} earlier point(s) are kept there)") from None

    def point(self, point: dict, details_file: Optional[str], details: Optional[dict]) -> None:
        arm = f"-{point['arm']}" if point.get("arm") else ""
        name = f"point-c{point['max_concurrency']}-r{point['repetition']}{arm}.json"
        if details_file is not None:
            self._write(details_file, gzip.compress(json.dumps(strict_json(scrub(details)), separators=(",", ":"),
                                                               allow_nan=False).encode(), mtime=0))
        self._write(name, dumps(scrub(point)).encode())

    def progress(self, result: "SweepResult") -> None:
        self._write(self.PARTIAL, dumps(result.record).encode())

    def finished(self, result: "SweepResult") -> None:
        self._write(self.FINAL, dumps(result.record).encode())

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)


