"""The results git repository: each sweep is one commit plus one annotated tag, all or nothing.

Layout inside the repository::

    records/<run_id>/record.json
    records/<run_id>/details/c<C>_r<R>.json.gz      (per-request arrays of each point)

``publish`` never touches the work tree or the index until the record is referenced: it writes
blobs, builds the tree in a private index file, creates the commit and the tag objects, and
then moves the branch and creates the tag in ONE ``git update-ref --stdin`` transaction
(both or neither). An exception or Ctrl-C before that leaves no commit, no tag and no file
(only unreferenced objects, which ``git gc`` drops). Tags are created, never moved: a tag name
that exists is refused. Afterwards the work tree (if any) is fast-forwarded to the new commit.
When another publish moved the branch between reading it and the transaction (git: "cannot lock
ref"), the commit is rebuilt on the new head and the transaction retried (``PUBLISH_ATTEMPTS``);
each record lives under its own ``records/<run_id>/``, so two sweeps never write the same path.

The transaction is the commit point. From just before it until the work tree has been updated,
Ctrl-C is held back (and the git processes run in their own session, out of the terminal's reach):
``Published.interrupted`` then says that an interrupt came, and the record is complete.

``check_writable`` runs before a sweep: it finds git and makes sure the repository can be
created or written, so that a bad path never costs a sweep.

Records are written and read on ONE named branch, ``main`` (``BRANCH``): a repository whose HEAD
is detached (a checked-out record tag) or on another branch is refused before any work, naming
what is checked out, so new records never go where ``records list`` cannot see them, nor onto a
user's branch. A publish killed after its commit point (the work tree not yet brought along)
leaves the index one record behind; ``catch_up`` finishes that step before anything else runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from dsv4kit.core.paths import cannot_write, default_results_repo
from dsv4kit.records import eval_record
from dsv4kit.records.record import RecordError, check as check_bench


def check(record, where: str = "record") -> dict:
    """A bench or an eval record, checked by its own schema (RecordError otherwise)."""
    return eval_record.check(record, where) if eval_record.is_eval(record) else check_bench(record, where)

TAG_PREFIX = "bench/"
RECORDS_DIR = "records"
ZERO_OID = "0" * 40
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_FALLBACK_IDENTITY = {"GIT_AUTHOR_NAME": "dsv4kit", "GIT_AUTHOR_EMAIL": "dsv4kit@localhost",
                      "GIT_COMMITTER_NAME": "dsv4kit", "GIT_COMMITTER_EMAIL": "dsv4kit@localhost"}
GIT_TIMEOUT_S = 120
#: Publishing rebuilds on the new head and retries when another publish moved the branch first.
PUBLISH_ATTEMPTS = 5

#: The one branch records live on.
BRANCH = "main"
BRANCH_REF = f"refs/heads/{BRANCH}"


#: The results repository when none is given; its one home is :mod:`dsv4kit.core.paths`.
default_path = default_results_repo


class ResultsRepoError(RuntimeError):
    """The results repository cannot be used or updated (message says why)."""


class GitNotFound(ResultsRepoError):
    """There is no ``git`` executable on this machine (an environment problem, not bad input)."""


@dataclass
class Published:
    commit: str
    tag: str
    run_id: str
    paths: list[str]
    #: Ctrl-C came after the commit point; the record is published and complete all the same.
    interrupted: bool = False
    #: Why the work tree could not be fast-forwarded (the branch and the tag are fine), if so.
    worktree_warning: Optional[str] = None
    #: How many times the transaction ran (more than 1: another publish moved the branch first).
    attempts: int = 1
    #: Nothing was committed: the record was already published under this tag (``published_as``).
    already: bool = False


@dataclass
class RecordEntry:
    run_id: str
    tag: Optional[str]
    path: str


def git_executable() -> str:
    """The ``git`` on PATH; GitNotFound when there is none."""
    found = shutil.which("git")
    if found is None:
        raise GitNotFound("git not found on PATH: the results repository needs git (install it, e.g. "
                          "`apt-get install git`)")
    return found


def _git(repo: Path, *args: str, input: Optional[bytes] = None, env: Optional[dict] = None,
         check: bool = True, own_session: bool = False) -> subprocess.CompletedProcess:
    """Run git in ``repo``. Failing to start it, or a timeout, is a ResultsRepoError too.

    ``own_session``: the process runs in a new session, so a Ctrl-C at the terminal cannot reach it.
    """
    full_env = dict(os.environ)
    # git never walks up from the results repository into a checkout around it (a half-made .git
    # would otherwise make every command below act on that parent repository).
    full_env["GIT_CEILING_DIRECTORIES"] = str(Path(repo).absolute().parent)
    full_env.update(env or {})
    try:
        proc = subprocess.run([git_executable(), "-C", str(repo), *args], input=input, capture_output=True,
                              env=full_env, timeout=GIT_TIMEOUT_S, start_new_session=own_session)
    except subprocess.TimeoutExpired:
        raise ResultsRepoError(f"git {' '.join(args[:3])} did not finish within {GIT_TIMEOUT_S} s in {repo} "
                               f"(it was stopped)") from None
    except OSError as exc:
        raise ResultsRepoError(f"could not run git {' '.join(args[:3])} in {repo}: {exc}") from None
    if check and proc.returncode != 0:
        raise ResultsRepoError(f"git {' '.join(args[:3])} failed in {repo}: "
                               f"{proc.stderr.decode(errors='replace').strip()}")
    return proc


def _out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.decode().strip()


def check_path(path: os.PathLike | str) -> bool:
    """Whether ``path`` is already a git repository; raise unless it is one, or absent, or empty."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ResultsRepoError(f"results repository {str(path)!r} is a file, not a directory")
    if path.is_dir() and ((path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())):
        check_own_repository(path)
        return True
    if path.is_dir() and any(path.iterdir()):
        raise ResultsRepoError(f"{str(path)!r} exists, is not empty and is not a git repository; "
                               f"pass an empty or new directory with --results-repo")
    return False


def check_own_repository(path: Path) -> None:
    """Raise unless ``path`` is a git repository of its own: its work tree's top (or a bare
    repository itself), never a folder that git resolves to a checkout around it."""
    outside = subprocess.run([git_executable(), "-C", str(path), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                             env={k: v for k, v in os.environ.items() if k != "GIT_CEILING_DIRECTORIES"})
    proc = _git(path, "rev-parse", "--is-bare-repository", "--absolute-git-dir", check=False)
    lines = _out(proc).splitlines()
    parent = (f"; git resolves it to the checkout at {outside.stdout.strip()}"
              if outside.returncode == 0 and Path(outside.stdout.strip()).resolve() != path.resolve() else "")
    if proc.returncode != 0 or len(lines) != 2:
        raise ResultsRepoError(f"{str(path)!r} has a .git that is not a usable repository of its own (a half-made "
                               f"one?){parent}: refusing to write records there (remove its .git, or pass another "
                               f"directory with --results-repo)")
    if lines[0] == "true":
        if Path(lines[1]).resolve() != path.resolve():
            raise ResultsRepoError(f"{str(path)!r} is not a repository of its own{parent}")
        return
    top = _out(_git(path, "rev-parse", "--show-toplevel", check=False))
    if not top or Path(top).resolve() != path.resolve():
        raise ResultsRepoError(f"{str(path)!r} is a folder inside the checkout at {top or '?'}, not a repository of "
                               f"its own: refusing to commit records there")


def _probe_dir(directory: Path, what: str) -> None:
    """Raise ResultsRepoError unless a file can be created (and removed) in ``directory``."""
    problem = cannot_write(directory)
    if problem:
        raise ResultsRepoError(f"{what} {str(directory)!r} is not writable: {problem}")


def check_option(repo: Path) -> None:
    """``--results-repo`` before any work: Abort(ENVIRONMENT) without git, Abort(USAGE) when
    ``repo`` cannot take a record (``check_writable``)."""
    from dsv4kit.core import exitcodes

    try:
        check_writable(repo)
    except GitNotFound as exc:
        raise exitcodes.Abort(exitcodes.ENVIRONMENT, f"--results-repo: {exc}") from None
    except ResultsRepoError as exc:
        raise exitcodes.Abort(exitcodes.USAGE, f"--results-repo: {exc}") from None


def check_writable(path: os.PathLike | str) -> bool:
    """Before a sweep: git is there, and the repository at ``path`` can be created or written.

    Returns whether it already is a repository. Raises GitNotFound (no git) or ResultsRepoError
    (a file in the way, a non-empty non-repository, an unwritable directory, a repository git
    refuses). Creates nothing.
    """
    path = Path(path)
    git_executable()
    exists = check_path(path)
    if exists:
        proc = _git(path, "rev-parse", "--absolute-git-dir", check=False)
        if proc.returncode != 0:
            raise ResultsRepoError(f"git cannot use the results repository {str(path)!r}: "
                                   f"{proc.stderr.decode(errors='replace').strip()}")
        git_dir = Path(_out(proc))
        for directory in (git_dir, git_dir / "objects", git_dir / "refs" / "tags"):
            if directory.is_dir():
                _probe_dir(directory, "results repository directory")
        if not _bare(path):
            _probe_dir(path, "results repository work tree")
        check_branch(path)
        return True
    if path.is_dir():  # empty: git init writes into it
        _probe_dir(path, "results repository directory")
        return False
    # Absent: the nearest existing ancestor must be a directory we may create it in.
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ResultsRepoError(f"cannot create the results repository {str(path)!r}: {str(ancestor)!r} is a "
                               f"file, not a directory")
    _probe_dir(ancestor, f"cannot create the results repository {str(path)!r}: directory")
    return False


def check_branch(repo: Path) -> None:
    """Raise unless HEAD is the records branch (``BRANCH``), by name: a detached HEAD or another
    branch is refused, naming it and the command that puts HEAD back."""
    symbolic = _git(repo, "symbolic-ref", "-q", "HEAD", check=False)
    name = _out(symbolic)
    if symbolic.returncode == 0 and name == BRANCH_REF:
        return
    if symbolic.returncode == 0:
        what = f"HEAD is on branch {name.removeprefix('refs/heads/')!r}"
    else:
        at = _out(_git(repo, "describe", "--tags", "--always", "HEAD", check=False)) or "?"
        what = f"HEAD is detached at {at} (a checked-out record tag?)"
    raise ResultsRepoError(f"results repository {str(repo)!r}: {what}; records are written and read on branch "
                           f"{BRANCH!r} only (`git -C {repo} checkout {BRANCH}` puts it back): nothing was run")


def catch_up(repo: Path) -> Optional[str]:
    """Bring the index and work tree of a non-bare ``repo`` to the branch when a publish was killed
    after its commit point (the index is still the previous commit's tree, the work tree matches
    the index). Returns what was done, in words, or None when nothing needed doing."""
    if _bare(repo):
        return None
    head = _git(repo, "rev-parse", "-q", "--verify", f"{BRANCH_REF}^{{tree}}", check=False)
    if head.returncode != 0:
        return None
    index_tree = _git(repo, "write-tree", check=False)
    if index_tree.returncode != 0 or _out(index_tree) == _out(head):
        return None
    # Stat data only (a copied or restored repository) is no change: refresh before comparing.
    _git(repo, "update-index", "-q", "--refresh", check=False, own_session=True)
    if _git(repo, "diff-files", "--quiet", check=False).returncode != 0:
        return None  # the user changed files: not ours to move
    behind = _out(index_tree)
    # Only a catch-up: the index must be the tree of one of the branch's recent commits.
    if not any(_out(_git(repo, "rev-parse", "-q", "--verify", f"{BRANCH_REF}~{k}^{{tree}}", check=False)) == behind
               for k in range(1, 21)):
        return None
    moved = _git(repo, "read-tree", "-m", "-u", behind, BRANCH_REF, check=False, own_session=True)
    if moved.returncode != 0:
        return None
    return f"the work tree of {repo} was brought up to {BRANCH} (an earlier publish stopped after its commit)"


def ensure_repo(path: os.PathLike | str) -> Path:
    """The results repository at ``path``, created (``git init -b main``) when absent or empty."""
    path = Path(path)
    if check_path(path):
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.init-", dir=path.parent))
    except OSError as exc:
        raise ResultsRepoError(f"cannot create the results repository {str(path)!r}: {exc}") from None
    try:
        # Made complete beside it, then renamed into place: an interrupted init leaves no half .git.
        _git(staging, "init", "-q", "-b", "main")
        if path.is_dir():  # empty
            os.rename(staging / ".git", path / ".git")
        else:
            os.rename(staging, path)
    except OSError as exc:
        raise ResultsRepoError(f"cannot create the results repository {str(path)!r}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    check_own_repository(path)
    return path


def _identity_env(repo: Path) -> dict:
    env = {}
    if not _out(_git(repo, "config", "user.name", check=False)) and "GIT_AUTHOR_NAME" not in os.environ:
        env.update({k: v for k, v in _FALLBACK_IDENTITY.items() if "NAME" in k})
    if not _out(_git(repo, "config", "user.email", check=False)) and "GIT_AUTHOR_EMAIL" not in os.environ:
        env.update({k: v for k, v in _FALLBACK_IDENTITY.items() if "EMAIL" in k})
    return env


def _bare(repo: Path) -> bool:
    return _out(_git(repo, "rev-parse", "--is-bare-repository")) == "true"


def tag_exists(repo: Path, tag: str) -> bool:
    return _git(repo, "rev-parse", "-q", "--verify", f"refs/tags/{tag}", check=False).returncode == 0


def published_as(repo: Path, run_id: str, tag: str) -> Optional[str]:
    """The commit that published ``run_id`` under ``tag`` on the records branch, or None: the record is
    already there when the tag exists, names a commit on the branch, and that commit holds
    ``records/<run_id>/record.json``."""
    if not Path(repo).exists() or not tag_exists(repo, tag):
        return None
    commit = _out(_git(repo, "rev-parse", f"refs/tags/{tag}^{{commit}}"))
    on_branch = _git(repo, "merge-base", "--is-ancestor", commit, BRANCH_REF, check=False).returncode == 0
    holds = _git(repo, "cat-file", "-e", f"{commit}:{RECORDS_DIR}/{run_id}/record.json", check=False).returncode == 0
    return commit if on_branch and holds else None


def publish(repo: os.PathLike | str, *, run_id: str, tag: str, files: dict[str, bytes], message: str) -> Published:
    """Commit ``files`` (paths relative to the repo) and tag the commit, atomically."""
    repo = ensure_repo(repo)
    if _git(repo, "check-ref-format", f"refs/tags/{tag}", check=False).returncode != 0:
        raise ResultsRepoError(f"{tag!r} is not a valid git tag name")
    if tag_exists(repo, tag):
        raise ResultsRepoError(f"tag {tag!r} already exists in {repo}; published tags are never moved")
    check_branch(repo)
    catch_up(repo)
    branch = BRANCH_REF
    env = _identity_env(repo)
    bare = _bare(repo)
    published = Published(commit="", tag=tag, run_id=run_id, paths=sorted(files))
    blobs = {rel: _out(_git(repo, "hash-object", "-w", "--stdin", input=data)) for rel, data in sorted(files.items())}
    for attempt in range(PUBLISH_ATTEMPTS):
        head_proc = _git(repo, "rev-parse", "-q", "--verify", f"{branch}^{{commit}}", check=False)
        head = _out(head_proc) if head_proc.returncode == 0 else None
        commit, transaction = _prepare(repo, branch, head, run_id, tag, blobs, message, env)
        published.commit = commit
        with _sigint_held() as interrupts:
            try:
                proc = _git(repo, "update-ref", "--stdin", input=transaction.encode(), check=False, own_session=True)
            except ResultsRepoError:
                if not tag_exists(repo, tag):  # a transaction that timed out may still have committed
                    raise
                proc = subprocess.CompletedProcess([], 0, b"", b"")
            if proc.returncode != 0:
                if interrupts:
                    raise KeyboardInterrupt  # nothing was changed; the user asked to stop
                error = proc.stderr.decode(errors="replace").strip()
                if _lost_race(error) and attempt + 1 < PUBLISH_ATTEMPTS and not tag_exists(repo, tag):
                    continue  # another publish moved the branch first: rebuild on its head
                raise ResultsRepoError(f"could not publish {run_id} in {repo} (nothing was changed): {error}")
            # Committed: the branch and the tag exist. The rest only brings the work tree along.
            if not bare:
                try:
                    updated = _git(repo, "read-tree", "-m", "-u", head or _EMPTY_TREE, commit, check=False,
                                   own_session=True)
                    if updated.returncode != 0:
                        published.worktree_warning = updated.stderr.decode(errors="replace").strip()
                except ResultsRepoError as exc:
                    published.worktree_warning = str(exc)
            published.attempts = attempt + 1
            break
    published.interrupted = bool(interrupts)
    return published


def _lost_race(error: str) -> bool:
    """git's words when the branch moved between reading it and the update-ref transaction."""
    return "cannot lock ref" in error or "but expected" in error or "reference already exists" in error


def _prepare(repo: Path, branch: str, head: Optional[str], run_id: str, tag: str, blobs: dict[str, str],
             message: str, env: dict) -> tuple[str, str]:
    """The commit (on ``head``) adding ``blobs`` and the tag object; returns (commit, transaction)."""
    if head:
        prefix = f"{RECORDS_DIR}/{run_id}/"
        existing = _out(_git(repo, "ls-tree", "-r", "--name-only", head, "--", prefix))
        if existing:
            raise ResultsRepoError(f"{prefix} already exists in {repo}; run ids are never reused")
    try:
        private = tempfile.TemporaryDirectory(prefix="dsv4kit-index-")
    except OSError as exc:  # a full disk: nothing was changed yet
        raise ResultsRepoError(f"cannot create the private index for {run_id}: {exc}") from None
    with private as tmp:
        index_env = {**env, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if head:
            _git(repo, "read-tree", head, env=index_env)
        else:
            _git(repo, "read-tree", "--empty", env=index_env)
        for rel, blob in blobs.items():
            _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=index_env)
        tree = _out(_git(repo, "write-tree", env=index_env))
    parents = ["-p", head] if head else []
    commit = _out(_git(repo, "commit-tree", tree, *parents, "-m", message, env=env))
    ident = _out(_git(repo, "var", "GIT_COMMITTER_IDENT", env=env))
    tag_text = f"object {commit}\ntype commit\ntag {tag}\ntagger {ident}\n\n{message}\n"
    tag_obj = _out(_git(repo, "mktag", input=tag_text.encode(), env=env))
    transaction = (
        f"update {branch} {commit} {head or ZERO_OID}\n"
        f"create refs/tags/{tag} {tag_obj}\n"
    )
    return commit, transaction


@contextmanager
def _sigint_held() -> Iterator[list[int]]:
    """Hold Ctrl-C back inside the block; the yielded list says whether one came (main thread only)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


# ------------------------------------------------------------------------------------ reading
def list_records(repo: os.PathLike | str) -> list[RecordEntry]:
    """Every record on the branch, oldest first, with the tag that published it."""
    repo = Path(repo)
    if not repo.exists():
        raise ResultsRepoError(f"results repository {str(repo)!r} does not exist")
    head = _git(repo, "rev-parse", "-q", "--verify", f"{BRANCH_REF}^{{commit}}", check=False)
    if head.returncode != 0:
        return []
    names = _out(_git(repo, "ls-tree", "-r", "--name-only", BRANCH_REF, "--", f"{RECORDS_DIR}/")).splitlines()
    tags = {}
    refs = _out(_git(repo, "for-each-ref", "--format=%(refname:strip=2) %(*objectname)", f"refs/tags/{TAG_PREFIX}",
                     f"refs/tags/{eval_record.TAG_PREFIX}"))
    for line in refs.splitlines():
        name, _, commit = line.partition(" ")
        tags[commit] = name
    entries = []
    for name in names:
        match = re.fullmatch(rf"{RECORDS_DIR}/([^/]+)/record\.json", name)
        if not match:
            continue
        run_id = match.group(1)
        commit = _out(_git(repo, "log", "-1", "--format=%H", BRANCH_REF, "--", name))
        entries.append(RecordEntry(run_id=run_id, tag=tags.get(commit), path=name))
    entries.sort(key=lambda e: (re.findall(r"\d{8}T\d{6}Z", e.run_id) or [""])[-1] + e.run_id)
    return entries


def read_record(repo: os.PathLike | str, ident: str) -> dict:
    """Load a record by run id, tag (``bench/...``), unique run-id prefix, or a record.json path."""
    candidate = Path(ident)
    if ident.endswith(".json") and candidate.is_file():
        try:
            return check(json.loads(candidate.read_text()), str(candidate))
        except ValueError as exc:
            raise RecordError(f"{candidate}: {exc}") from None
    repo = Path(repo)
    entries = list_records(repo)
    by_tag = [e for e in entries if e.tag == ident or (e.tag and ident == f"refs/tags/{e.tag}")]
    exact = [e for e in entries if e.run_id == ident]
    prefix = [e for e in entries if e.run_id.startswith(ident)]
    matches = by_tag or exact or prefix
    if not matches:
        known = ", ".join(e.run_id for e in entries[-5:]) or "none"
        raise RecordError(f"no record {ident!r} in {repo} (latest: {known}); see `dsv4kit records list`")
    if len(matches) > 1:
        raise RecordError(f"{ident!r} is ambiguous in {repo}: {', '.join(e.run_id for e in matches)}")
    return read_entry(repo, matches[0])


def read_entry(repo: os.PathLike | str, entry: RecordEntry) -> dict:
    """Load the record of an entry ``list_records`` returned (no second listing)."""
    repo = Path(repo)
    text = _git(repo, "show", f"{BRANCH_REF}:{entry.path}").stdout.decode()
    try:
        return check(json.loads(text), f"{repo}:{entry.path}")
    except ValueError as exc:
        raise RecordError(f"{repo}:{entry.path}: {exc}") from None


def read_details(repo: os.PathLike | str, run_id: str, details_file: str) -> dict:
    import gzip

    data = _git(Path(repo), "show", f"{BRANCH_REF}:{RECORDS_DIR}/{run_id}/{details_file}").stdout
    return json.loads(gzip.decompress(data))
