"""What the bench, eval and profile copy to the box imports there with the standard library alone:
the box-side package (``dsv4box``) and the scripts beside it, which use its one HTTP client."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace


class CopySession:
    """An SSH session that copies files into a local directory: every command "succeeds" and prints
    that directory (what ``mktemp -d`` would print)."""

    def __init__(self, root: Path):
        self.root = root

    def run(self, command, timeout=None, check=True, **kwargs):
        return SimpleNamespace(exit_code=0, stdout=f"{self.root}\n", stderr="")

    def put(self, local, remote) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(local, remote)


def test_the_eval_and_profile_scripts_import_the_box_package_http_client_as_shipped(tmp_path):
    from dsv4kit.serving.remote import Remote
    from dsv4kit.profile.run import BOX_SCRIPT
    from dsv4kit.quality.run import BoxEval

    session = CopySession(tmp_path)
    host = SimpleNamespace(venv_python=sys.executable, name="box", get=lambda key, default=None: None)
    remote = Remote(session, host, lambda line: None)
    remote.setup()  # the bench's box-side package, as dsv4box
    BoxEval(remote, "http://127.0.0.1:9", None, lambda line: None)  # box_eval.py and its prompt files
    session.put(BOX_SCRIPT, f"{remote.workdir}/{BOX_SCRIPT.name}")  # as dsv4kit.profile.run does
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import box_eval, box_profile, api_prompts, dsv4box.http as h; "
            "assert box_eval.request is h.request and api_prompts.open_request is h.open_request; "
            "assert box_profile._http() is h; assert not [m for m in sys.modules if m.startswith('dsv4kit')]; "
            "print('ok')")
    # -S: no site-packages (dsv4kit, SGLang's dependencies), as a bare venv python; -E: no PYTHONPATH
    done = subprocess.run([sys.executable, "-S", "-E", "-s", "-c", code, str(tmp_path)], cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    for script in ("box_eval.py", "box_profile.py"):
        shown = subprocess.run([sys.executable, "-S", "-E", "-s", str(tmp_path / script), "--help"],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "usage" in shown.stdout, shown.stderr[-2000:]

