#!/usr/bin/env python3
"""Put one pinned revision of a Hugging Face model repository into a directory, verified.

Usage: model_weights.py --repo R --revision SHA --dest DIR [--endpoint URL] [--allow-unpinned]
       [--check] [--rehash] [--token-stdin] [--workers N] [--log FILE] [--drafter FOLDER|bundled]
Run with the SGLang venv's python (huggingface_hub comes with transformers there). The token is
read from stdin (--token-stdin), never from argv; it is never printed.

Every file of the revision is checked against the hub's metadata: its size, and the SHA-256 of
LFS files or the git blob SHA-1 of small ones. A directory that holds a file with other content,
or a file the revision does not have, is refused (named, never overwritten). Files that are
missing are downloaded (a fresh or interrupted download). Once all match, a marker
(MARKER in DIR) records the revision and each file's size, mtime and digest: a later run whose
files still have the recorded size and mtime is verified without the network (--rehash: hash
every file again, for corruption that kept sizes and mtimes).

--drafter FOLDER: the revision ships a DSpark draft model in FOLDER (its config.json and at least
one .safetensors file); a revision without them is refused, and the drafter's files are verified
with the rest (the JSON's "drafter" field counts them). --drafter bundled: the drafter's weights
are in the checkpoint itself, as DeepSeek-V4-Flash-0731 ships it; its config.json must carry the
dspark_* keys by which SGLang 0.5.23 recognises a bundled drafter, checked once it is on disk (the
"drafter" field gives the block size it was trained with).

Prints one JSON object: status (verified, downloaded, would_download, refused, error), changed,
message and details. Exit 0 ok, 1 refused (a directory that does not match), 2 bad input,
5 huggingface_hub missing from this python, 6 the hub failed or refused the request.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import sys
import time

MARKER = ".dsv4kit-weights.json"
BUNDLED = "bundled"
# Any of these in config.json marks a drafter bundled in the checkpoint (SGLang 0.5.23's rule).
DSPARK_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids")
# Free space kept beyond the missing files' bytes (huggingface_hub's bookkeeping, the marker, logs).
FREE_MARGIN = 64 * 1024 * 1024
# huggingface_hub's own bookkeeping of a local_dir download (resume metadata, .incomplete files).
HUB_BOOKKEEPING = ".cache/huggingface/"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 1 << 24


class Refused(Exception):
    """The request cannot go on; carries the exit code and the JSON fields."""

    def __init__(self, code, status, message, **details):
        super().__init__(message)
        self.code, self.status, self.details = code, status, details


def git_blob_sha1(path, size):
    digest = hashlib.sha1(b"blob %d\0" % size)
    return _feed(digest, path)


def sha256(path):
    return _feed(hashlib.sha256(), path)


def _feed(digest, path):
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)


def expected_files(siblings):
    """{name: {"size", "sha256" or "blob_id"}} from the hub's file metadata."""
    files = {}
    for sibling in siblings:
        name = sibling.rfilename
        if sibling.lfs:
            files[name] = {"size": int(sibling.lfs["size"]), "sha256": sibling.lfs["sha256"]}
        elif sibling.blob_id and sibling.size is not None:
            files[name] = {"size": int(sibling.size), "blob_id": sibling.blob_id}
        else:
            raise Refused(6, "error", f"the hub gave no size and hash for {name}: cannot verify it")
    return files


def local_files(dest):
    """Relative names of the files under dest, without the marker and the hub's bookkeeping."""
    found = []
    for root, dirs, names in os.walk(dest):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), dest).replace(os.sep, "/")
            if rel != MARKER and not rel.startswith(HUB_BOOKKEEPING):
                found.append(rel)
    return sorted(found)


def bundled_summary(dest, repo, revision):
    """{"bundled", "block_size", "keys"} from the checkpoint's config.json; "checked": False before it
    is on disk; Refused when it marks no bundled drafter."""
    try:
        with open(os.path.join(dest, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        return {"bundled": True, "checked": False}
    except (OSError, ValueError) as exc:
        raise Refused(1, "refused", f"{dest}/config.json cannot be read to find the bundled DSpark drafter: {exc}")
    found = sorted(key for key in DSPARK_KEYS if isinstance(config, dict) and config.get(key) is not None)
    if not found:
        raise Refused(1, "refused", f"{repo}@{revision} bundles no DSpark drafter: its config.json has none of "
                                    f"{', '.join(DSPARK_KEYS)} (dsv4_models' drafter says 'bundled'); set it to '' "
                                    f"and dsv4_speculative to EAGLE or off, or pin a revision that ships one",
                      drafter=BUNDLED)
    return {"bundled": True, "checked": True, "block_size": config.get("dspark_block_size"), "keys": found}


def drafter_summary(names_sizes, folder, repo, revision, dest=None):
    """{"folder", "files", "bytes"} of the DSpark drafter in folder (or bundled_summary); Refused
    when the revision lacks it."""
    if not folder:
        return None
    if folder == BUNDLED:
        return bundled_summary(dest, repo, revision) if dest else {"bundled": True, "checked": False}
    prefix = folder.strip("/") + "/"
    mine = {name: size for name, size in names_sizes.items() if name.startswith(prefix)}
    lacking = [what for what, present in (("config.json", prefix + "config.json" in mine),
                                          (".safetensors file", any(n.endswith(".safetensors") for n in mine)))
               if not present]
    if lacking:
        raise Refused(1, "refused", f"{repo}@{revision} ships no DSpark drafter in {prefix} (no {' and no '.join(lacking)} "
                                    f"there): the inventory's drafter of this model (dsv4_models) names a folder the "
                                    f"revision lacks; set it to '' and dsv4_speculative to EAGLE or off, or pin a revision "
                                    f"that ships one", drafter=prefix)
    return {"folder": prefix, "files": len(mine), "bytes": sum(mine.values())}


def read_marker(dest):
    try:
        with open(os.path.join(dest, MARKER)) as handle:
            marker = json.load(handle)
        return marker if isinstance(marker, dict) and isinstance(marker.get("files"), dict) else None
    except (OSError, ValueError):
        return None


def stat_matches(path, recorded):
    try:
        info = os.stat(path)
    except OSError:
        return False
    return info.st_size == recorded.get("size") and info.st_mtime_ns == recorded.get("mtime_ns")


def verified_by_marker(dest, repo, revision):
    """The marker's record when it names this repo and revision and every file still has the
    recorded size and mtime and no other file appeared; else None."""
    marker = read_marker(dest)
    if not marker or marker.get("repo") != repo or marker.get("revision") != revision:
        return None
    if sorted(marker["files"]) != local_files(dest):
        return None
    if all(stat_matches(os.path.join(dest, name), rec) for name, rec in marker["files"].items()):
        return marker
    return None


def check_file(dest, name, want, marker):
    """None when dest/name has the wanted size and digest, else why not."""
    path = os.path.join(dest, name)
    try:
        size = os.path.getsize(path)
    except OSError:
        return "missing"
    if size != want["size"]:
        return f"size {size}, the revision has {want['size']}"
    recorded = (marker or {}).get("files", {}).get(name)
    key = "sha256" if "sha256" in want else "blob_id"
    if recorded and key in recorded and stat_matches(path, recorded):
        digest = recorded[key]  # unchanged since a run that hashed it
    else:
        digest = sha256(path) if key == "sha256" else git_blob_sha1(path, size)
    return None if digest == want[key] else f"{key} {digest}, the revision has {want[key]}"


def check_all(dest, files, marker, workers):
    """{name: problem} for every file of the revision that is not right (missing ones too)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(files, pool.map(lambda item: check_file(dest, item[0], item[1], marker),
                                           files.items())))
    return {name: problem for name, problem in results.items() if problem}


def write_marker(dest, repo, revision, files):
    record = {}
    for name, want in files.items():
        info = os.stat(os.path.join(dest, name))
        record[name] = {**want, "mtime_ns": info.st_mtime_ns}
    path = os.path.join(dest, MARKER)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump({"repo": repo, "revision": revision, "verified_at": int(time.time()), "files": record},
                  handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def room_for(dest, need, count, summary):
    """Refused (exit 1) when the filesystem of ``dest`` has less free space than ``need`` bytes plus
    FREE_MARGIN: a full disk would stop the download half-way with a bare "No space left on device"."""
    where = dest
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    stats = os.statvfs(where)
    free = stats.f_bavail * stats.f_frsize
    if free >= need + FREE_MARGIN:
        return
    gib = 1024 ** 3
    raise Refused(1, "refused",
                  f"{dest} has {free / gib:.2f} GiB free (on the filesystem of {where}); the {count} missing files of the "
                  f"revision need {need / gib:.2f} GiB, plus {FREE_MARGIN / gib:.2f} GiB of room: free "
                  f"{(need + FREE_MARGIN - free) / gib:.2f} GiB more there, or point dsv4_model_path at a larger disk. "
                  "Nothing was downloaded.", need_bytes=need, free_bytes=free, **summary)


def progress(log, line):
    """One line to stderr and, with --log, appended to that file (tail -f it during a download)."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n"
    sys.stderr.write(line)
    sys.stderr.flush()
    if log:
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        with open(log, "a") as handle:
            handle.write(line)


def hub_failure(exc, repo, revision, had_token):
    """A clear Refused for an error huggingface_hub raised."""
    from huggingface_hub import errors

    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    where = "dsv4_hf_token (Ansible Vault) or HF_TOKEN in the environment of dsv4kit provision"
    if isinstance(exc, errors.GatedRepoError):
        if had_token:
            return Refused(6, "error", f"{repo} is gated and the token's account has no access: accept the "
                                       f"repository's conditions on the hub with that account ({where})")
        return Refused(6, "error", f"{repo} is gated: give a token of an account that accepted its conditions ({where})")
    if status == 401 and had_token:
        return Refused(6, "error", f"the hub rejected the token (401 Unauthorized) for {repo}: "
                                   f"check {where}")
    if isinstance(exc, errors.RevisionNotFoundError):
        return Refused(6, "error", f"{repo} has no revision {revision} (dsv4_model_revision)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        hint = "" if had_token else f"; if it is private or gated, give a token ({where})"
        return Refused(6, "error", f"the hub does not show {repo} (dsv4_model_repo){hint}")
    text = " ".join(str(exc).split())
    return Refused(6, "error", f"the hub request failed ({type(exc).__name__}): {text}")


def run(args, token):
    if not COMMIT.match(args.revision) and not args.allow_unpinned:
        raise Refused(2, "error", f"dsv4_model_revision {args.revision!r} is not a commit hash (40 hex digits): "
                                  "pin the commit (set dsv4_model_allow_unpinned: true to follow a branch)")
    dest = os.path.abspath(args.dest)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise Refused(1, "refused", f"{dest} exists and is not a directory")
    if os.path.isdir(dest) and COMMIT.match(args.revision) and not args.rehash:
        marker = verified_by_marker(dest, args.repo, args.revision)
        if marker:
            total = sum(rec["size"] for rec in marker["files"].values())
            drafter = drafter_summary({n: r["size"] for n, r in marker["files"].items()}, args.drafter,
                                      args.repo, args.revision, dest)
            return 0, {"status": "verified", "changed": False, "revision": args.revision,
                       "files": len(marker["files"]), "bytes": total, "drafter": drafter,
                       "message": f"{dest}: {args.repo}@{args.revision} verified earlier, files unchanged"}
    try:
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError as exc:
        raise Refused(5, "error", f"huggingface_hub is not importable by {sys.executable}: {exc} "
                                  "(it comes with SGLang's transformers; run the sglang_venv stage)")
    had_token = bool(token)
    try:
        info = HfApi(endpoint=args.endpoint).model_info(
            args.repo, revision=args.revision, files_metadata=True, token=token or False)
    except HfHubHTTPError as exc:
        raise hub_failure(exc, args.repo, args.revision, had_token) from None
    except Exception as exc:  # no connection, a timeout, an answer that is not the hub's
        raise Refused(6, "error", f"cannot read {args.repo}@{args.revision} from {args.endpoint or 'the hub'}: "
                                  f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
    revision = info.sha or ""
    if not COMMIT.match(revision) or (COMMIT.match(args.revision) and revision != args.revision):
        raise Refused(6, "error", f"the hub answered {args.repo}@{args.revision} with commit {revision!r}")
    files = expected_files(info.siblings or [])
    total = sum(want["size"] for want in files.values())
    summary = {"revision": revision, "files": len(files), "bytes": total,
               "drafter": drafter_summary({n: w["size"] for n, w in files.items()}, args.drafter, args.repo, revision,
                                          dest if os.path.isdir(dest) else None)}

    present = local_files(dest) if os.path.isdir(dest) else []
    extra = [name for name in present if name not in files]
    marker = None if args.rehash else read_marker(dest)
    problems = check_all(dest, files, marker, args.workers) if present else {name: "missing" for name in files}
    missing = sorted(name for name, problem in problems.items() if problem == "missing")
    mismatched = {name: problem for name, problem in problems.items() if problem != "missing"}
    if extra or mismatched:
        lines = [f"{name}: {problem}" for name, problem in sorted(mismatched.items())]
        lines += [f"{name}: not a file of the revision" for name in extra]
        raise Refused(1, "refused",
                      f"{dest} does not match {args.repo}@{revision} and is left as it is (nothing is overwritten): "
                      + "; ".join(lines) + ". Point dsv4_model_path at an empty or new directory, or move this one away.",
                      mismatched=sorted(mismatched), extra=extra, **summary)
    if not missing and verified_by_marker(dest, args.repo, revision):  # a branch that did not move
        return 0, {"status": "verified", "changed": False, **summary,
                   "message": f"{dest}: {args.repo}@{revision} verified earlier, files unchanged"}
    if missing:
        room_for(dest, sum(files[name]["size"] for name in missing), len(missing), summary)
    if args.check:
        if missing:
            size = sum(files[name]["size"] for name in missing)
            return 0, {"status": "would_download", "changed": True, "missing": missing, **summary,
                       "message": f"would download {len(missing)} of {len(files)} files ({size} bytes) into {dest}"}
        return 0, {"status": "verified", "changed": True, **summary,
                   "message": f"{dest} matches {args.repo}@{revision}; a run records it as verified"}

    os.makedirs(dest, mode=0o755, exist_ok=True)
    cache_dir = os.path.join(os.environ.get("HF_HOME") or os.path.join(dest, HUB_BOOKKEEPING), "hub")

    def fetch(name):
        hf_hub_download(args.repo, name, revision=revision, local_dir=dest, cache_dir=cache_dir,
                        token=token or False, endpoint=args.endpoint)
        progress(args.log, f"downloaded {name} ({files[name]['size']} bytes)")

    progress(args.log, f"{args.repo}@{revision}: downloading {len(missing)} of {len(files)} files into {dest}")

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
            list(pool.map(fetch, missing))
    except HfHubHTTPError as exc:
        raise hub_failure(exc, args.repo, revision, had_token) from None
    problems = check_all(dest, {name: files[name] for name in missing}, None, args.workers)
    extra = [name for name in local_files(dest) if name not in files]
    if problems or extra:
        lines = [f"{name}: {problem}" for name, problem in sorted(problems.items())]
        lines += [f"{name}: not a file of the revision" for name in extra]
        raise Refused(1, "refused", f"after the download {dest} still does not match {args.repo}@{revision}: "
                                    + "; ".join(lines), mismatched=sorted(problems), extra=extra, **summary)
    summary["drafter"] = drafter_summary({n: w["size"] for n, w in files.items()}, args.drafter, args.repo, revision,
                                         dest)  # a bundled drafter is checked in the downloaded config.json
    write_marker(dest, args.repo, revision, files)
    progress(args.log, f"{args.repo}@{revision}: all {len(files)} files verified")
    status = "downloaded" if missing else "verified"
    message = (f"downloaded {len(missing)} of {len(files)} files into {dest}, all {len(files)} verified"
               if missing else f"{dest} matches {args.repo}@{revision}, recorded as verified")
    return 0, {"status": status, "changed": True, "downloaded": missing, "message": message, **summary}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--dest", required=True)
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--allow-unpinned", action="store_true")
    parser.add_argument("--check", action="store_true", help="report what a run would do, change nothing")
    parser.add_argument("--token-stdin", action="store_true", help="read the token from the first line of stdin")
    parser.add_argument("--rehash", action="store_true",
                        help="hash every file again, even those the marker records as unchanged")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--log", default=None, help="also append progress lines to this file")
    parser.add_argument("--drafter", default="", help="the revision's folder that must hold its DSpark drafter, "
                                                      "or 'bundled': the checkpoint holds it (config.json's dspark_* keys)")
    args = parser.parse_args(argv)
    token = sys.stdin.readline().strip() if args.token_stdin else ""
    try:
        code, result = run(args, token)
    except Refused as exc:
        code, result = exc.code, {"status": exc.status, "changed": False, "message": str(exc), **exc.details}
    except Exception as exc:  # anything else: one line, never a traceback
        code, result = 6, {"status": "error", "changed": False,
                           "message": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
    text = json.dumps(result, sort_keys=True)
    if token:
        text = text.replace(token, "***")
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
