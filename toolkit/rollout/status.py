"""``python -m dsv4kit.rollout status [--json]``: what the dsv4kit plugin would do in this venv.

Runs in the SGLang venv on the box (or on any machine) with the standard library only: the
SGLang version comes from its distribution metadata, the targets are found by parsing SGLang's
source files with ``ast`` (nothing from SGLang, torch or tilelang is imported into this
process), and the plugin entry point is resolved the way SGLang resolves it
(``importlib.metadata``). For a flag that is on, a child process checks that the dsv4kit kernel
modules import (they need torch and triton).

Exit codes (dsv4kit.core.exitcodes): 0 the report is consistent (every flagged target would be
replaced, or no flag is set); 1 a flag is set but something keeps a target stock; 5 SGLang is
not installed in this interpreter's environment; 2 bad usage.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import os
import sys
from typing import Optional

from dsv4kit.core import exitcodes
from dsv4kit.rollout.targets import (
    FLAGS,
    INDEXER_FLAG,
    PLUGIN_GROUP,
    PLUGIN_NAME,
    PLUGIN_VALUE,
    SUPPORTED_SGLANG_VERSIONS,
    TARGETS,
    Target,
    format_parameters,
    read_flag,
    sglang_version,
    version_supported,
)


SGLANG_CONTEXT_ENV = ("SGLANG_OPT_USE_TILELANG_INDEXER", "SGLANG_OPT_USE_AITER_INDEXER",
                      "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_SM120_FLASHMLA_BACKEND", "SGLANG_PLUGINS")


def _sglang_dir() -> Optional[str]:
    """Directory of the ``sglang`` package, found without executing its ``__init__``."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _ast_parameters(node) -> tuple:
    """The canonical parameter tuple of rollout_targets.canonical_parameters, from an AST node."""
    a = node.args
    out = [p.arg for p in a.posonlyargs]
    if a.posonlyargs:
        out.append("/")
    out += [p.arg for p in a.args]
    if a.vararg:
        out.append(f"*{a.vararg.arg}")
    elif a.kwonlyargs:
        out.append("*")
    out += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        out.append(f"**{a.kwarg.arg}")
    return tuple(out)


def _top_level(body):
    """Module-level statements, including those inside top-level if/try blocks."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody):
                yield from _top_level(block)
            for handler in stmt.handlers:
                yield from _top_level(handler.body)


def inspect_source(path: str, target: Target) -> dict:
    """Find ``target.function`` (and the kept constant) in the file at ``path`` by parsing it."""
    found = {"source": path, "found": False, "parameters": None, "problem": None}
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except FileNotFoundError:
        found["problem"] = f"{target.module} is missing ({path} does not exist)"
        return found
    except (OSError, SyntaxError, ValueError) as exc:
        found["problem"] = f"cannot parse {path}: {exc}"
        return found
    function = None
    constant = None
    for stmt in _top_level(tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == target.function:
            function = stmt  # the last definition wins, as at run time
        elif target.keep_attribute and isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            names = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(n, ast.Name) and n.id == target.keep_attribute for n in names):
                constant = stmt.value
    if function is None:
        found["problem"] = f"{target.module} has no {target.function} (moved or renamed in this SGLang?)"
        return found
    found["found"] = True
    found["parameters"] = list(_ast_parameters(function))
    if tuple(found["parameters"]) != tuple(target.parameters):
        found["problem"] = (f"signature is {format_parameters(found['parameters'])}, dsv4kit expects "
                            f"{format_parameters(target.parameters)}")
    elif target.keep_attribute:
        ok = (isinstance(constant, ast.Constant) and isinstance(constant.value, int)
              and not isinstance(constant.value, bool) and constant.value >= 1)
        if constant is None:
            found["problem"] = f"{target.module}.{target.keep_attribute} is missing"
        elif not ok:
            found["problem"] = f"{target.module}.{target.keep_attribute} is not a positive int literal"
        else:
            found[target.keep_attribute] = constant.value
    return found


def _plugin_report(environ) -> dict:
    report = {"installed": False, "entry_point": f"{PLUGIN_NAME} = {PLUGIN_VALUE}", "dist": None,
              "resolvable": False, "allowed": True, "problem": None}
    matches = [ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)
               if ep.name == PLUGIN_NAME]
    if not matches:
        report["problem"] = (f"no '{PLUGIN_NAME}' entry point in group {PLUGIN_GROUP}: the dsv4kit "
                             "wheel is not installed in this environment")
        return report
    ep = matches[0]
    report["installed"] = True
    report["entry_point"] = f"{ep.name} = {ep.value}"
    dist = getattr(ep, "dist", None)
    if dist is not None:
        report["dist"] = f"{dist.name} {dist.version}"
    try:
        report["resolvable"] = callable(ep.load())
        if not report["resolvable"]:
            report["problem"] = f"{ep.value} is not callable"
    except Exception as exc:  # report, never crash
        report["problem"] = f"{ep.value} does not load: {type(exc).__name__}: {exc}"
    allowed = (environ.get("SGLANG_PLUGINS") or "").strip()
    if allowed:
        names = {x.strip() for x in allowed.split(",") if x.strip()}
        if PLUGIN_NAME not in names:
            report["allowed"] = False
            report["problem"] = (f"SGLANG_PLUGINS={allowed!r} does not list '{PLUGIN_NAME}', so SGLang "
                                 "skips the plugin")
    return report


KERNEL_IMPORT_TIMEOUT_S = 45
_SLOW_IMPORT = f"importing it did not finish within {KERNEL_IMPORT_TIMEOUT_S} s"

_IMPORT_PROBE = """
import importlib, json, sys
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        text = str(exc).strip().splitlines()
        errors[name] = type(exc).__name__ + (": " + text[0] if text else "")
print(json.dumps(errors))
"""


def kernel_import_problems(modules) -> dict:
    """``{module: why}`` for the dsv4kit kernel modules this interpreter cannot import.

    The plugin imports them on the first call and falls back to SGLang's original when that
    fails, so status must know. They import torch and triton, so the import runs in a child
    process (this report stays standard-library only and fast to start) with a timeout."""
    import subprocess

    modules = sorted(set(modules))
    if not modules:
        return {}
    try:
        done = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *modules], capture_output=True, text=True,
                              timeout=KERNEL_IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {m: _SLOW_IMPORT for m in modules}
    except OSError as exc:
        return {m: f"cannot run {sys.executable}: {exc}" for m in modules}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {m: f"the import probe failed (rc {done.returncode}): {tail}" for m in modules}


def _env_bool(environ, name: str, default: bool) -> bool:
    """An SGLang switch: unset means SGLang's default; a set value reads like our own flags
    (SGLang's EnvBool rules, so an empty value is false)."""
    if environ.get(name) is None:
        return default
    return read_flag(name, environ).enabled


def indexer_route(environ) -> str:
    """Which indexer SGLang 0.5.23 calls on sm_120 (docs/sglang-contract.md §3.1), from its own switches: "tilelang",
    "aiter", "torch" or "deepgemm". Unset switches take the sm_120 defaults that SGLang's model
    hook applies (TileLang and torch on), so only explicit settings move the route."""
    if _env_bool(environ, "SGLANG_OPT_USE_TILELANG_INDEXER", True):
        return "tilelang"
    if _env_bool(environ, "SGLANG_OPT_USE_AITER_INDEXER", False):
        return "aiter"
    if _env_bool(environ, "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", True):
        return "torch"
    return "deepgemm"


# The indexer route each indexer target serves.
_ROUTE_OF_TARGET = {"indexer": "torch", "indexer_tilelang": "tilelang"}


DEFAULT_DECISION_FILE = "/etc/dsv4kit/kernel-decision.json"  # box-side: core.box_paths.DECISION_FILE, held equal by a test
_ON = ("1", "true", "yes", "y")  # SGLang's true spellings, as rollout_targets reads them


def read_decision(path: Optional[str], flags: dict) -> dict:
    """The kernel_rollout role's decision file: which report decided each flag, with its numbers.

    Normalised to {"path", "report", "flags": {FLAG: {"value", "source", ...}}, "settings":
    {"dsv4_fp4_indexer": {"value": bool, "source", "why", ...}}, "warnings"}; a flag whose value in
    this environment differs from the decided one is a warning (a hand edit?).
    """
    out = {"path": path, "report": None, "flags": {}, "settings": {}, "warnings": []}
    if not path:
        return out
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        out["warnings"].append(f"no decision file at {path}: the flags were not set by dsv4kit provision")
        return out
    except (OSError, ValueError) as exc:
        out["warnings"].append(f"the decision file {path} is unreadable: {exc}")
        return out
    out["report"] = data.get("report") if isinstance(data, dict) else None
    settings = data.get("settings") if isinstance(data, dict) else None
    out["settings"] = {k: e for k, e in (settings or {}).items() if isinstance(e, dict)} \
        if isinstance(settings, dict) else {}
    for name, entry in ((data.get("flags") or {}) if isinstance(data, dict) else {}).items():
        if not isinstance(entry, dict):  # written from the inventory: name -> value
            entry = {"value": str(entry), "source": data.get("source", "inventory")}
        out["flags"][name] = entry
        seen = flags.get(name)
        decided_on = str(entry.get("value")).strip().lower() in _ON
        if seen is not None and not seen.error and decided_on != seen.enabled:
            out["warnings"].append(f"{name} is {seen.raw!r} here but was decided {entry.get('value')!r} "
                                   f"({entry.get('source')}); the environment is not the one provisioned")
    return out


def status_report(environ=None, decision_path: Optional[str] = None) -> dict:
    """The full report as a JSON-able dict; ``exit_code`` says how a script should read it.

    ``decision_path``: the kernel_rollout role's decision file, shown as ``decision``."""
    environ = os.environ if environ is None else environ
    from dsv4kit import __version__

    version = sglang_version()
    sglang_dir = _sglang_dir()
    report = {
        "python": sys.executable,
        "dsv4kit_version": __version__,
        "sglang": {"installed": version is not None or sglang_dir is not None, "version": version,
                   "supported": version_supported(version),
                   "supported_versions": list(SUPPORTED_SGLANG_VERSIONS), "location": sglang_dir},
    }
    # SGLang's own switches that decide which indexer target it dispatches to (docs/sglang-contract.md §3.1) and the
    # plugin whitelist; shown as seen, unset meaning SGLang's sm_120 defaults.
    report["sglang_env"] = {name: environ.get(name) for name in SGLANG_CONTEXT_ENV}
    flags = {name: read_flag(name, environ) for name in FLAGS}
    report["flags"] = {name: {"value": f.raw, "enabled": f.enabled, "error": f.error}
                       for name, f in flags.items()}
    report["plugin"] = plugin = _plugin_report(environ)
    report["decision"] = read_decision(decision_path, flags)
    if not report["sglang"]["installed"]:
        report["targets"] = []
        report["problems"] = ["SGLang is not installed in this interpreter's environment"]
        report["exit_code"] = exitcodes.ENVIRONMENT
        return report

    route = indexer_route(environ)
    report["indexer_route"] = route
    import_problems = kernel_import_problems(
        t.kernel_module for t in TARGETS
        if flags[t.flag].enabled and importlib.util.find_spec(t.kernel_module) is not None)
    targets, warnings = [], []
    for target in TARGETS:
        flag = flags[target.flag]
        entry = {"key": target.key, "target": target.dotted, "flag": target.flag,
                 "kernel": target.kernel, "replaced": False, "applicable": True, "reasons": []}
        if not target.module.startswith("sglang."):
            # Another package's function SGLang imports (DeepGEMM's FP4 indexer): its signature
            # is checked by the plugin in the server; here only whether it is installed.
            entry.update(found=importlib.util.find_spec(target.requires or target.module) is not None,
                         source=None, parameters=list(target.parameters), problem=None)
        elif sglang_dir:
            entry.update(inspect_source(target.source_file(sglang_dir), target))
        else:
            entry.update(found=False, source=None, parameters=None,
                         problem="the sglang package directory was not found")
        if target.requires and importlib.util.find_spec(target.requires) is None:
            entry["applicable"] = False
            entry["reasons"].append(f"{target.requires} is not importable; SGLang cannot use this "
                                    "target either")
        if flag.error:
            entry["reasons"].append(flag.error)
        elif not flag.enabled:
            entry["reasons"].append(f"{target.flag} is not set")
        if not report["sglang"]["supported"]:
            entry["reasons"].append(f"SGLang {version or 'of unknown version'} is not supported "
                                    f"(supported: {', '.join(SUPPORTED_SGLANG_VERSIONS)})")
        if not (plugin["installed"] and plugin["resolvable"] and plugin["allowed"]):
            entry["reasons"].append(plugin["problem"])
        source_problem = entry.pop("problem", None)
        if source_problem:
            entry["reasons"].append(source_problem)
        if importlib.util.find_spec(target.kernel_module) is None:
            entry["reasons"].append(f"the dsv4kit kernel module {target.kernel_module} is not installed")
        elif import_problems.get(target.kernel_module) == _SLOW_IMPORT:
            # Slow, not broken (a cold disk): said, but not a reason to call the target stock.
            warnings.append(f"{target.dotted}: the import check of {target.kernel_module} {_SLOW_IMPORT}")
        elif target.kernel_module in import_problems:
            entry["reasons"].append(f"the dsv4kit kernel module {target.kernel_module} does not import here "
                                    f"({import_problems[target.kernel_module]}); the plugin would fall back to "
                                    "SGLang's original")
        entry["replaced"] = not entry["reasons"]
        # Replaced, but does SGLang call it? Only the indexer target on SGLang's route runs.
        entry["on_route"] = _ROUTE_OF_TARGET.get(target.key, route) == route
        targets.append(entry)
    report["targets"] = targets

    problems = []
    for name, f in flags.items():
        if f.error:
            problems.append(f.error)
    for entry in targets:
        # A flag that is on must replace every applicable target it governs.
        if flags[entry["flag"]].enabled and entry["applicable"] and not entry["replaced"]:
            problems.append(f"{entry['target']}: " + "; ".join(entry["reasons"]))
    indexer_flag = flags[INDEXER_FLAG]
    if indexer_flag.enabled and route not in _ROUTE_OF_TARGET.values():
        problems.append(f"{INDEXER_FLAG} is on but SGLang's switches send the indexer to {route} "
                        f"(SGLANG_OPT_USE_TILELANG_INDEXER, SGLANG_OPT_USE_AITER_INDEXER, "
                        f"SGLANG_FP8_PAGED_MQA_LOGITS_TORCH), which dsv4kit does not replace: the kernel never runs")
    report["problems"] = problems
    report["warnings"] = warnings + report["decision"]["warnings"]
    report["exit_code"] = exitcodes.CHECK_FAILED if problems else exitcodes.OK
    return report


def render(report: dict) -> str:
    """The report as text for a person."""
    lines = []
    sg = report["sglang"]
    if not sg["installed"]:
        lines.append(f"SGLang: not installed for {report.get('python')}")
    else:
        support = "supported" if sg["supported"] else (
            f"NOT supported (supported: {', '.join(sg['supported_versions'])})")
        lines.append(f"SGLang: {sg['version'] or 'unknown version'} ({support}) at {sg['location']}")
    plugin = report["plugin"]
    if plugin["installed"] and plugin["resolvable"] and plugin["allowed"]:
        lines.append(f"Plugin: installed ({plugin['dist']}; {plugin['entry_point']})")
    else:
        lines.append(f"Plugin: NOT active: {plugin['problem']}")
    decision = report.get("decision") or {}
    for name, f in report["flags"].items():
        value = "unset" if f["value"] is None else repr(f["value"])
        state = "on" if f["enabled"] else ("INVALID" if f["error"] else "off")
        lines.append(f"Flag {name}: {state} ({value})")
        lines.extend(_decision_lines(decision, name))
    for name, entry in (decision.get("settings") or {}).items():
        lines.append(f"Setting {name}: {'on' if entry.get('value') is True else 'off'} (decided by "
                     f"{entry.get('source')}: {entry.get('why')})")
    context = ", ".join(f"{k}={v}" for k, v in report.get("sglang_env", {}).items() if v is not None)
    lines.append(f"SGLang switches: {context or 'none set (SGLang sm_120 defaults: TileLang indexer)'}")
    for entry in report["targets"]:
        if entry["replaced"]:
            verdict = f"REPLACED by {entry['kernel']} (first call checked against the contract)"
            if not entry.get("on_route", True):
                verdict += f"; not on SGLang's indexer route ({report.get('indexer_route')})"
        elif not entry["applicable"]:
            verdict = "not applicable: " + "; ".join(entry["reasons"])
        else:
            verdict = "stock: " + "; ".join(entry["reasons"])
        lines.append(f"  {entry['target']}: {verdict}")
    for warning in report.get("warnings", []):
        lines.append(f"WARNING: {warning}")
    for problem in report.get("problems", []):
        lines.append(f"PROBLEM: {problem}")
    return "\n".join(lines)


def _decision_lines(decision: dict, flag: str) -> list:
    entry = (decision.get("flags") or {}).get(flag)
    if not entry:
        return []
    source = entry.get("source")
    if entry.get("report"):  # the numbers (and, for "1", a quality record: its why says which)
        report = decision.get("report") or {}
        ident = report.get("identity") or {}
        lines = [f"  decided by report {entry.get('report')} ({report.get('measured_on')} GPU "
                 f"{report.get('gpu_index')}, {report.get('started_utc')}; {ident.get('gpu')}, driver "
                 f"{ident.get('driver')}, SGLang {ident.get('sglang')}): {entry.get('recommend')}: {entry.get('why')}"]
        for n in entry.get("numbers") or []:
            ours = "-" if n.get("ours_us") is None else f"{n['ours_us']:.1f}"
            stock = "-" if n.get("stock_us") is None else f"{n['stock_us']:.1f}"
            lines.append(f"    {n.get('shape')}: dsv4kit {ours} us, {entry.get('stock_default')} {stock} us: "
                         f"{n.get('outcome')}")
        return lines
    return [f"  decided by {source}: {entry.get('why') or 'set in dsv4_kernel_flags'}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4kit.rollout",
                                     description="State of the dsv4kit kernel rollout into SGLang.")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="SGLang version, plugin, flags and which targets would "
                                           "be replaced (reads files only; imports no SGLang)")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.add_argument("--decision", default=DEFAULT_DECISION_FILE,
                        help="the decision file kernel_rollout wrote beside the flags "
                             f"(default {DEFAULT_DECISION_FILE}); '' for none")
    status.add_argument("--textfile", default="",
                        help="also write dsv4kit_rollout_info into this node_exporter textfile directory "
                             "(the monitoring role's), atomically")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    report = status_report(decision_path=args.decision or None)
    if args.textfile:
        from dsv4kit.monitor.textfile import ROLLOUT_FILE, rollout_info_text, write_local

        try:
            os.makedirs(args.textfile, mode=0o755, exist_ok=True)  # the monitoring role runs after the rollout
            write_local(args.textfile, ROLLOUT_FILE, rollout_info_text(report))
        except OSError as exc:  # the dashboard lags; the status stands
            print(f"warning: {args.textfile}: {exc.strerror or exc}", file=sys.stderr)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
