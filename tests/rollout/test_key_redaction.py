"""The servers' API key stays out of what SGLang 0.5.23 logs and serves once it reads the key from
``--config`` (the units' server-secret.yaml): through SGLang's own argument pipeline, from the
cached 0.5.23 wheel, first without the dsv4kit plugin (the key leaks: the premise) and then with it."""

import json
import os
import subprocess
import sys

from dsv4kit.rollout.key_redaction import redact_argv
from tests import sglang_wheel

SCRIPT = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args
from sglang.srt.sampling.watermarking import core

def seen():
    args = prepare_server_args(["--model-path", sys.argv[1], "--tp", "4", "--config", sys.argv[2]])
    # engine.py's server_args= line and /server_info both go through redact_watermark_secrets
    logged = core.redact_watermark_secrets(args.resolved_dict())
    served = core.redact_watermark_secrets({"api_key": args.api_key, "launch_command": args.launch_command})
    return {"api_key": args.api_key, "launch_command": args.launch_command, "logged": json.dumps(logged, default=str),
            "served": json.dumps(served)}

stock = seen()
from dsv4kit.rollout import plugin
plugin.register()
print(json.dumps({"stock": stock, "plugin": seen()}))
"""


def test_the_key_from_config_is_redacted_in_launch_command_and_the_logged_server_args(tmp_path):
    secret = "s3cret-key-29"
    (tmp_path / "server-secret.yaml").write_text(f'api-key: "{secret}"\n')
    env = dict(os.environ, PYTHONPATH=str(sglang_wheel.sglang_site()))
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(tmp_path / "server-secret.yaml")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    stock, fixed = out["stock"], out["plugin"]
    assert stock["api_key"] == secret and secret in stock["launch_command"] and secret in stock["logged"]
    assert fixed["api_key"] == secret  # the server still enforces it
    for field in ("launch_command", "logged", "served"):
        assert secret not in fixed[field], (field, fixed[field])
    assert "--api-key <redacted>" in fixed["launch_command"]


def test_every_spelling_of_the_key_options_is_redacted():
    assert redact_argv(["--api-key", "a", "--admin-api-key=b", "--tp", "4"]) == [
        "--api-key", "<redacted>", "--admin-api-key=<redacted>", "--tp", "4"]
