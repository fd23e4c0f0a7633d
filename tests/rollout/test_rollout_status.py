"""Rollout targets against SGLang 0.5.23's real files, ``python -m dsv4kit.rollout status`` and
``dsv4kit rollout status``, and the wheel in a bare venv (no typer/fabric/yaml, no torch).

Nothing here imports SGLang: the status report parses its files, which is also what these tests
check against the unpacked 0.5.23 wheel (tests/sglang_wheel.py).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli_support import invoke

from dsv4kit.core import exitcodes
from dsv4kit.rollout.status import _ast_parameters, inspect_source
from dsv4kit.rollout.targets import (
    ATTENTION_KWARGS,
    PLUGIN_GROUP,
    TARGETS,
    canonical_parameters,
    read_flag,
    version_supported,
)
from tests import sglang_wheel

FLAGS_ON = {"SGLANG_SM120_TRITON_INDEXER": "1", "SGLANG_SM120_MMA_ATTENTION": "1"}


@pytest.fixture(scope="module")
def site():
    return sglang_wheel.sglang_site()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "rollout"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def sglang_venv(base):
    """An SGLang-like venv (the test venv's torch/triton and SGLang's import chain) with the wheel installed."""
    return sglang_wheel.session_venv(base, "sglang-venv")


@pytest.fixture(scope="module")
def bare_venv(base):
    """A venv with nothing but the standard library and the dsv4kit wheel (--no-deps)."""
    return sglang_wheel.session_venv(base, "bare-venv", with_sglang_deps=False)


def _status(python, sglang_path, env=None, timeout=60):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    if sglang_path is not None:
        full["PYTHONPATH"] = str(sglang_path)
    full.update(env or {})
    done = subprocess.run([str(python), "-m", "dsv4kit.rollout.status", "status", "--json"],
                          capture_output=True, text=True, env=full, timeout=timeout, cwd="/")
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _target(report, key):
    return next(t for t in report["targets"] if t["key"] == key)


# --- the targets, read from SGLang 0.5.23's files --------------------------------------------

def test_every_target_exists_in_sglang_0_5_23_with_the_expected_parameters(site):
    for target in TARGETS:
        if not target.module.startswith("sglang."):
            continue  # DeepGEMM's FP4 entry: see the next test
        found = inspect_source(target.source_file(str(site / "sglang")), target)
        assert found["found"] and found["problem"] is None, (target.dotted, found)
        assert tuple(found["parameters"]) == target.parameters
    attention = next(t for t in TARGETS if t.key == "attention")
    found = inspect_source(attention.source_file(str(site / "sglang")), attention)
    assert found["SM120_DECODE_MAX_TOKENS"] == 64


def test_sglang_imports_deepgemms_fp4_entry_at_call_time_with_eight_arguments(site):
    """With the FP4 cache, forward_c4_indexer imports the function from the deep_gemm package on
    every call (so the plugin's rebinding of the package attribute is seen) and calls it with the
    eight positional arguments of the FP4 target (docs/sglang-contract.md §2.10)."""
    text = (site / "sglang/srt/layers/attention/dsv4/indexer.py").read_text()
    fp4 = next(t for t in TARGETS if t.key == "indexer_fp4")
    assert f"from {fp4.module} import {fp4.function} as fn" in text
    assert "head_dim_with_sf = 68 if use_fp4_indexer else 132" in text
    call = text[text.index("logits = fn(", text.index("def run_paged_indexer")):]
    call = call[:call.index(")") + 1]
    assert call.count(",") == len(fp4.parameters) and "False" in call


def test_sglang_calls_the_targets_the_way_the_guards_expect(site):
    """The backend passes exactly ATTENTION_KWARGS, and both indexer names are looked up inside
    forward_c4_indexer at call time (so rebinding the module attribute is seen)."""
    backend = ast.parse((site / "sglang/srt/layers/attention/deepseek_v4_backend.py").read_text())
    calls = [n for n in ast.walk(backend) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "flash_mla_with_kvcache_sm120"]
    assert calls and all(not c.args for c in calls)
    assert {tuple(sorted(k.arg for k in c.keywords)) for c in calls} == {tuple(sorted(ATTENTION_KWARGS))}

    indexer = ast.parse((site / "sglang/srt/layers/attention/dsv4/indexer.py").read_text())
    fn = next(n for n in ast.walk(indexer)
              if isinstance(n, ast.FunctionDef) and n.name == "forward_c4_indexer")
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    local_imports = {(n.module, a.name) for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)
                     for a in n.names}
    assert "fp8_paged_mqa_logits_torch_sm120" in names
    assert ("sglang.kernels.ops.attention.dsa.tilelang_kernel",
            "tilelang_fp8_paged_mqa_logits") in local_imports
    backend_imports = {(n.module, a.name) for n in ast.walk(backend) if isinstance(n, ast.ImportFrom)
                       for a in n.names}
    assert ("sglang.kernels.ops.attention.flash_mla_sm120", "flash_mla_with_kvcache_sm120") in backend_imports


def test_sglang_plugin_api_is_what_the_plugin_uses(site):
    plugins = ast.parse((site / "sglang/srt/plugins/__init__.py").read_text())
    groups = {n.targets[0].id: n.value.value for n in plugins.body
              if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
    assert groups["GENERAL_PLUGINS_GROUP"] == PLUGIN_GROUP
    registry = ast.parse((site / "sglang/srt/plugins/hook_registry.py").read_text())
    hook_type = next(n for n in registry.body if isinstance(n, ast.ClassDef) and n.name == "HookType")
    assert "REPLACE" in {t.id for n in hook_type.body if isinstance(n, ast.Assign) for t in n.targets}
    cls = next(n for n in registry.body if isinstance(n, ast.ClassDef) and n.name == "HookRegistry")
    register = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "register")
    assert _ast_parameters(register) == ("cls", "target", "hook", "hook_type", "*", "source")


def test_ast_and_inspect_give_the_same_canonical_parameters():
    source = (
        "def a(x, y=1): pass\n"
        "def b(**kwargs): pass\n"
        "def c(p, /, q, *args, r, **kw): pass\n"
        "def d(p, /): pass\n"
        "def e(*, k): pass\n"
    )
    tree = ast.parse(source)
    namespace: dict = {}
    exec(compile(source, "<sig>", "exec"), namespace)
    for node in tree.body:
        assert _ast_parameters(node) == canonical_parameters(inspect.signature(namespace[node.name])), node.name
    assert canonical_parameters(inspect.signature(namespace["c"])) == ("p", "/", "q", "*args", "r", "**kw")
    assert canonical_parameters(inspect.signature(namespace["e"])) == ("*", "k")


def test_flags_and_versions_parse_like_sglang():
    assert read_flag("X", {"X": "1"}).enabled and read_flag("X", {"X": "True"}).enabled
    assert not read_flag("X", {}).enabled and not read_flag("X", {"X": "0"}).enabled
    bad = read_flag("X", {"X": "on"})
    assert not bad.enabled and "not a boolean" in bad.error
    assert version_supported("0.5.23") and version_supported("0.5.23+cu130")
    assert not version_supported("0.5.23.post1") and not version_supported("0.5.24")
    assert not version_supported(None)


# --- python -m dsv4kit.rollout status (stdlib only) -------------------------------------------

def test_status_flags_on_in_the_sglang_venv(sglang_venv, site):
    rc, report = _status(sglang_venv, site, FLAGS_ON)
    assert rc == exitcodes.OK, report["problems"]
    assert report["sglang"]["version"] == "0.5.23" and report["sglang"]["supported"]
    assert report["plugin"]["installed"] and report["plugin"]["resolvable"]
    assert report["plugin"]["entry_point"] == "dsv4kit = dsv4kit.sglang_plugin:register"
    assert report["flags"]["SGLANG_SM120_TRITON_INDEXER"]["enabled"]
    assert _target(report, "indexer")["replaced"] and _target(report, "attention")["replaced"]
    tilelang = _target(report, "indexer_tilelang")  # tilelang is not installed here
    assert not tilelang["replaced"] and not tilelang["applicable"]
    assert "tilelang is not importable" in tilelang["reasons"][0]


@pytest.mark.parametrize("env, route", [
    ({}, "tilelang"),  # SGLang's sm_120 defaults
    ({"SGLANG_OPT_USE_TILELANG_INDEXER": "0"}, "torch"),
    ({"SGLANG_OPT_USE_TILELANG_INDEXER": ""}, "torch"),  # set but empty: false, as SGLang reads it
    ({"SGLANG_OPT_USE_TILELANG_INDEXER": "false", "SGLANG_OPT_USE_AITER_INDEXER": "1"}, "aiter"),
    ({"SGLANG_OPT_USE_TILELANG_INDEXER": "0", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "0"}, "deepgemm"),
])
def test_indexer_route_follows_sglangs_switches(env, route):
    from dsv4kit.rollout.status import indexer_route

    assert indexer_route(env) == route


def test_status_flags_on_but_indexer_routed_elsewhere_is_a_problem(sglang_venv, site):
    rc, report = _status(sglang_venv, site, dict(FLAGS_ON, SGLANG_OPT_USE_TILELANG_INDEXER="0",
                                                 SGLANG_FP8_PAGED_MQA_LOGITS_TORCH="0"))
    assert rc == exitcodes.CHECK_FAILED
    assert report["indexer_route"] == "deepgemm"
    assert any("send the indexer to deepgemm" in p for p in report["problems"])
    # The torch route is the one the torch target serves: no problem there.
    rc, report = _status(sglang_venv, site, dict(FLAGS_ON, SGLANG_OPT_USE_TILELANG_INDEXER="0"))
    assert rc == exitcodes.OK, report["problems"]
    assert _target(report, "indexer")["on_route"]


def test_status_flags_unset_is_stock_and_ok(sglang_venv, site):
    rc, report = _status(sglang_venv, site, {"SGLANG_OPT_USE_TILELANG_INDEXER": "0"})
    assert rc == exitcodes.OK
    assert report["sglang_env"]["SGLANG_OPT_USE_TILELANG_INDEXER"] == "0"
    assert report["sglang_env"]["SGLANG_SM120_FLASHMLA_BACKEND"] is None
    for entry in report["targets"]:
        assert not entry["replaced"]
        assert f"{entry['flag']} is not set" in entry["reasons"]


def test_status_one_flag_only(sglang_venv, site):
    rc, report = _status(sglang_venv, site, {"SGLANG_SM120_MMA_ATTENTION": "1"})
    assert rc == exitcodes.OK
    assert _target(report, "attention")["replaced"] and not _target(report, "indexer")["replaced"]


def test_status_unsupported_version(sglang_venv, base):
    newer = sglang_wheel.sglang_variant(base / "status-0.5.24", version="0.5.24")
    rc, report = _status(sglang_venv, newer, FLAGS_ON)
    assert rc == exitcodes.CHECK_FAILED
    assert report["sglang"] == dict(report["sglang"], version="0.5.24", supported=False)
    assert not _target(report, "indexer")["replaced"]
    assert any("SGLang 0.5.24 is not supported (supported: 0.5.23)" in p for p in report["problems"])


def test_status_missing_target_and_changed_signature(sglang_venv, base):
    drift = sglang_wheel.sglang_variant(base / "status-drift", edits={
        "sglang/srt/layers/attention/dsv4/indexer.py":
            lambda t: t.replace("def fp8_paged_mqa_logits_torch_sm120(", "def _gone("),
        "sglang/kernels/ops/attention/flash_mla_sm120.py":
            lambda t: t.replace("def flash_mla_with_kvcache_sm120(**kwargs):",
                                "def flash_mla_with_kvcache_sm120(q, **kwargs):"),
    })
    rc, report = _status(sglang_venv, drift, FLAGS_ON)
    assert rc == exitcodes.CHECK_FAILED
    indexer, attention = _target(report, "indexer"), _target(report, "attention")
    assert not indexer["found"] and not indexer["replaced"]
    assert any("has no fp8_paged_mqa_logits_torch_sm120" in r for r in indexer["reasons"])
    assert attention["parameters"] == ["q", "**kwargs"] and not attention["replaced"]
    assert any("signature is (q, **kwargs), dsv4kit expects (**kwargs)" in r
               for r in attention["reasons"])


def test_status_invalid_flag_and_plugin_excluded(sglang_venv, site):
    rc, report = _status(sglang_venv, site, {"SGLANG_SM120_TRITON_INDEXER": "on"})
    assert rc == exitcodes.CHECK_FAILED
    assert any("SGLANG_SM120_TRITON_INDEXER='on' is not a boolean" in p for p in report["problems"])
    rc, report = _status(sglang_venv, site, dict(FLAGS_ON, SGLANG_PLUGINS="other"))
    assert rc == exitcodes.CHECK_FAILED
    assert not report["plugin"]["allowed"]
    assert "SGLANG_PLUGINS='other' does not list 'dsv4kit'" in _target(report, "indexer")["reasons"][0]


def test_status_without_sglang_exits_5(bare_venv):
    rc, report = _status(bare_venv, None, FLAGS_ON)
    assert rc == exitcodes.ENVIRONMENT
    assert not report["sglang"]["installed"]


# --- the wheel on a box: --no-deps, standard library only ------------------------------------

def test_wheel_installs_no_deps_and_runs_without_cli_dependencies(bare_venv, site):
    probe = ("import importlib.util, json, sys\n"
             "import dsv4kit, dsv4kit.rollout.plugin, dsv4kit.rollout.status, dsv4kit.core.exitcodes\n"
             "absent = [m for m in ('typer', 'fabric', 'yaml', 'torch', 'sglang.srt')\n"
             "          if m in sys.modules]\n"
             "missing = [m for m in ('typer', 'fabric', 'yaml', 'ansible')\n"
             "           if importlib.util.find_spec(m) is not None]\n"
             "print(json.dumps([dsv4kit.__file__, absent, missing]))\n")
    done = subprocess.run([str(bare_venv), "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"]}, cwd="/")
    assert done.returncode == 0, done.stderr
    location, imported, available = json.loads(done.stdout)
    assert "site-packages" in location  # the installed wheel, not this checkout
    assert imported == [] and available == []
    # With SGLang's files on the path (a CPU control box, or the box): a full report without
    # importing torch. The flags are on but this venv has no torch, so the kernels cannot import:
    # the plugin would fall back, and status says so (the import is probed in a child process).
    rc, report = _status(bare_venv, site, FLAGS_ON)
    assert rc == exitcodes.CHECK_FAILED
    assert report["plugin"]["installed"]
    assert report["problems"] and all("does not import here (ModuleNotFoundError: No module named 'torch')" in p
                                      for p in report["problems"])
    rc, report = _status(bare_venv, site, {})  # flags off: nothing to replace, nothing imported
    assert rc == exitcodes.OK, report["problems"]


# --- dsv4kit rollout status (the CLI) ----------------------------------------------------------

def test_cli_status_python_renders_the_venv_report(sglang_venv, site, monkeypatch):
    monkeypatch.setenv("SGLANG_SM120_TRITON_INDEXER", "1")
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = invoke(["rollout", "status", "--python", str(sglang_venv)])
    assert result.exit_code == exitcodes.OK, result.output
    assert "SGLang: 0.5.23 (supported)" in result.output
    assert "Flag SGLANG_SM120_TRITON_INDEXER: on ('1')" in result.output
    assert "fp8_paged_mqa_logits_torch_sm120: REPLACED by dsv4kit.kernels.indexer" in result.output
    assert "flash_mla_with_kvcache_sm120: stock: SGLANG_SM120_MMA_ATTENTION is not set" in result.output

    result = invoke(["rollout", "status", "--json", "--python", str(sglang_venv)])
    assert result.exit_code == exitcodes.OK
    assert json.loads(result.output)["python"] == str(sglang_venv)

    # A relative --python is taken from here, although the report runs from "/".
    monkeypatch.chdir(sglang_venv.parent.parent)
    relative = sglang_venv.relative_to(sglang_venv.parent.parent)
    result = invoke(["rollout", "status", "--json", "--python", str(relative)])
    assert result.exit_code == exitcodes.OK, result.output


def test_cli_status_python_errors(tmp_path, base):
    result = invoke(["rollout", "status", "--python", str(tmp_path / "nope")])
    assert result.exit_code == exitcodes.USAGE and "no such file" in result.output

    plain = sglang_wheel.session_venv(base, "plain-venv", with_dsv4kit=False, with_sglang_deps=False)
    result = invoke(["rollout", "status", "--python", str(plain)])
    assert result.exit_code == exitcodes.ENVIRONMENT
    assert "dsv4kit is not installed" in result.output

    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    result = invoke(["rollout", "status", "--python", str(slow), "--timeout", "1"])
    assert result.exit_code == exitcodes.TIMEOUT and "did not finish within 1s" in result.output


def test_cli_status_in_process(site):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    env.update(PYTHONPATH=str(site), SGLANG_SM120_MMA_ATTENTION="1")
    done = subprocess.run([sys.executable, "-m", "dsv4kit.cli", "rollout", "status", "--json"],
                          capture_output=True, text=True, env=env, timeout=120, cwd="/")
    report = json.loads(done.stdout)
    assert report["python"] == sys.executable
    assert report["sglang"]["version"] == "0.5.23"
    assert report["flags"]["SGLANG_SM120_MMA_ATTENTION"]["enabled"]
    # Whether this interpreter's dsv4kit carries the entry point depends on how it was installed
    # (an editable install made before the entry point existed does not): the exit code says so.
    assert done.returncode == (exitcodes.OK if report["plugin"]["installed"] else exitcodes.CHECK_FAILED)

    result = invoke(["rollout", "status", "--help"])
    assert result.exit_code == 0 and "--python" in result.output


# --- the plugin's early guards, without SGLang ------------------------------------------------

def _register_in_subprocess(env):
    code = ("import json, logging\n"
            "logging.basicConfig(format='%(levelname)s %(message)s')\n"
            "from dsv4kit.rollout import plugin as p\n"
            "p.register(); p.register()\n"
            "print(json.dumps(p.rollout_state()))\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "PYTHON"))}
    full.update(env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), [x for x in done.stderr.splitlines() if x.strip()]


def test_plugin_invalid_flag_logs_one_line_and_touches_nothing():
    state, lines = _register_in_subprocess({"SGLANG_SM120_TRITON_INDEXER": "on"})
    assert lines == ["WARNING dsv4kit rollout: SGLANG_SM120_TRITON_INDEXER='on' is not a boolean "
                     "(use 1 to turn it on, 0 or unset for off); "
                     "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120, "
                     "sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_fp8_paged_mqa_logits, "
                     "deep_gemm.fp8_fp4_paged_mqa_logits stay stock"]
    assert {k: v["status"] for k, v in state.items()} == {
        "indexer": "stock", "indexer_tilelang": "stock", "indexer_fp4": "stock"}


def test_plugin_without_sglang_metadata_stays_stock_with_one_line():
    state, lines = _register_in_subprocess(FLAGS_ON)
    assert len(lines) == 1 and lines[0].startswith(
        "WARNING dsv4kit rollout: SGLang unknown (no sglang distribution metadata) is not a "
        "supported version (supported: 0.5.23)")
    assert all(v["status"] == "stock" for v in state.values()) and len(state) == len(TARGETS)
