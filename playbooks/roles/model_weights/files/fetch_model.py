#!/usr/bin/env python3
"""Put a Hugging Face model at a pinned revision into a directory, verified; print one JSON object.

Usage: fetch_model.py REPO REVISION DEST OWNER [--allow-branch] [--check]
Runs with the SGLang venv's Python (huggingface_hub is an SGLang dependency). The token comes from
HF_TOKEN in the environment (never an argument, never printed); HF_ENDPOINT may name another hub.

Every file of the revision is checked against the hub's metadata: its size, and the sha256 of LFS
files (the git blob hash of the others). Files already in DEST that match are kept; missing ones are
downloaded; a file whose content differs, or a DEST holding another revision, is refused (exit 1)
and nothing is changed. `.dsv4kit-model.json` in DEST records what was verified (size and mtime per
file), so a later run re-hashes only files that changed. --check reports, changes nothing.
Exit codes: 0 ok, 1 refused (mismatch), 2 bad input, 6 the hub failed.
"""
import hashlib
import json
import os
import pwd
import re
import sys

MANIFEST = ".dsv4kit-model.json"
CHUNK = 16 << 20


def result(code, message, **extra):
    print(json.dumps({"rc": code, "message": message, "changed": extra.pop("changed", False), **extra}))
    return code


def file_hash(path, lfs):
    """sha256 of the content (LFS files) or git's blob sha1 (the hub's blobId of the others)."""
    digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv):
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 4:
        return result(2, "usage: fetch_model.py REPO REVISION DEST OWNER [--allow-branch] [--check]")
    repo, revision, dest, owner = args
    check = "--check" in flags
    if not re.fullmatch(r"[0-9a-f]{40}", revision) and "--allow-branch" not in flags:
        return result(2, f"dsv4_model_revision {revision!r} is not a commit hash: a branch moves under a running "
                         "deployment. Pin the 40-character commit (the hub's model page, 'Files and versions', or "
                         "`huggingface_hub.model_info(repo).sha`), or set model_weights_allow_branch: true.")
    try:
        user = pwd.getpwnam(owner)
    except KeyError:
        return result(2, f"the service user {owner!r} does not exist")
    try:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.utils import HfHubHTTPError
    except ImportError as exc:
        return result(5, f"huggingface_hub is not in the venv ({exc}); run the sglang_venv stage first")

    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    except HfHubHTTPError as exc:
        return result(6, f"the hub refused {repo}@{revision}: {str(exc).splitlines()[0]}")
    except Exception as exc:  # connection errors, timeouts
        return result(6, f"cannot reach the hub for {repo}@{revision}: {type(exc).__name__}: {exc}")
    commit = info.sha
    expected = {}
    for sibling in info.siblings or []:
        lfs = getattr(sibling, "lfs", None)
        expected[sibling.rfilename] = {"size": sibling.size, "lfs": lfs is not None,
                                       "hash": lfs.sha256 if lfs is not None else sibling.blob_id}
    if not expected:
        return result(6, f"the hub lists no files for {repo}@{revision}")

    manifest_path = os.path.join(dest, MANIFEST)
    manifest = {}
    if os.path.isfile(manifest_path):
        with open(manifest_path) as fh:
            manifest = json.load(fh)
        if manifest.get("repo") != repo or manifest.get("commit") != commit:
            return result(1, f"{dest} holds {manifest.get('repo')}@{manifest.get('commit')}, not {repo}@{commit}: "
                             "remove it (or choose another dsv4_model_path), then run the stage again")
    known = manifest.get("files", {})

    verified, missing, wrong = {}, [], []
    for name, meta in sorted(expected.items()):
        path = os.path.join(dest, name)
        if not os.path.isfile(path):
            missing.append(name)
            continue
        stat = os.stat(path)
        seen = known.get(name)
        if seen and seen["size"] == stat.st_size == meta["size"] and seen["mtime_ns"] == stat.st_mtime_ns \
                and seen["hash"] == meta["hash"]:
            verified[name] = seen
            continue
        if stat.st_size != meta["size"] or file_hash(path, meta["lfs"]) != meta["hash"]:
            wrong.append(name)
        else:
            verified[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "hash": meta["hash"]}
    if wrong:
        return result(1, f"{dest} does not match {repo}@{commit}: {len(wrong)} file(s) differ in size or hash "
                         f"({', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}); nothing was changed. Remove "
                         "the directory (or those files) to download them again.", wrong=wrong)

    downloaded = []
    if missing and check:
        return result(0, f"would download {len(missing)} file(s) of {repo}@{commit} into {dest}", changed=True,
                      missing=missing, commit=commit)
    if missing:
        try:
            snapshot_download(repo, revision=commit, local_dir=dest, allow_patterns=missing)
        except Exception as exc:
            return result(6, f"the download of {repo}@{commit} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        for name in missing:
            path = os.path.join(dest, name)
            meta = expected[name]
            if not os.path.isfile(path) or os.path.getsize(path) != meta["size"] or file_hash(path, meta["lfs"]) != meta["hash"]:
                if os.path.isfile(path):
                    os.unlink(path)  # never leave a file that does not verify
                return result(1, f"the hub served {name} of {repo}@{commit} with another size or hash than its metadata "
                                 "says; it was removed. Run the stage again.", changed=bool(downloaded), wrong=[name])
            stat = os.stat(path)
            verified[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "hash": meta["hash"]}
            downloaded.append(name)

    changed = bool(downloaded)
    if not check:
        for root, dirs, files in os.walk(dest):
            for entry in [root] + [os.path.join(root, f) for f in files]:
                st = os.lstat(entry)
                if (st.st_uid, st.st_gid) != (user.pw_uid, user.pw_gid):
                    os.lchown(entry, user.pw_uid, user.pw_gid)
                    changed = True
        record = {"repo": repo, "commit": commit, "files": verified}
        if record != manifest:
            staged = manifest_path + ".tmp"
            with open(staged, "w") as fh:
                json.dump(record, fh, indent=1, sort_keys=True)
            os.chown(staged, user.pw_uid, user.pw_gid)
            os.replace(staged, manifest_path)
            changed = True
    total = sum(m["size"] for m in expected.values())
    return result(0, f"{repo}@{commit}: {len(expected)} files, {total / 2**30:.1f} GiB verified in {dest}"
                     + (f" ({len(downloaded)} downloaded)" if downloaded else ""),
                  changed=changed, commit=commit, downloaded=downloaded)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
