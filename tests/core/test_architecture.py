"""The package map of docs/architecture.md, checked against the tree.

* pyproject's package list is every package of the tree, and ``.pkgroot/dsv4kit`` (the link farm
  editors and ``PYTHONPATH=.pkgroot`` resolve ``dsv4kit`` through) mirrors ``package-dir``;
* every ``dsv4kit.*`` import and dotted ``dsv4kit.*`` string in the product and the tests
  resolves statically, through that farm, to a module and a name it binds;
* imports run one way (entry -> commands -> capabilities -> validation -> core -> kernels), with
  no circle between modules or capabilities, and no capability importing a command module;
* no package uses another package's underscore (private) names;
* a command function stays short.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
FARM = REPO / ".pkgroot" / "dsv4kit"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIR = PYPROJECT["package-dir"]
CAPABILITIES = ("provision", "validate", "serving", "bench", "profile", "quality", "records", "rollout", "monitor",
                "doctor")
LAYER = {"entry": 0, "commands": 1, **{c: 2 for c in CAPABILITIES}, "validation": 3, "core": 4, "kernels": 5,
         "root": 6}
MAX_COMMAND_LINES = 65
# Imported on purpose to prove a missing dsv4kit module keeps its traceback (tests/core/test_missing_package.py).
MEANT_TO_BE_MISSING = {"dsv4kit.no_such_module"}


def _source_files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    """The import name of a product file (``toolkit/bench/run.py`` -> ``dsv4kit.bench.run``)."""
    rel = path.relative_to(REPO)
    for package, folder in sorted(PACKAGE_DIR.items(), key=lambda kv: -len(kv[1])):
        if rel.parts[:len(Path(folder).parts)] == Path(folder).parts:
            rest = rel.parts[len(Path(folder).parts):]
            parts = [*package.split("."), *rest]
            parts[-1] = parts[-1][:-3]
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise AssertionError(f"{rel} is under no package-dir entry")


PRODUCT = {module_name(p): p for p in _source_files("toolkit", "kernels", "validation")}


def _module_file(name: str) -> Path | None:
    """The file ``name`` resolves to through the link farm, as Python or pyright would find it."""
    parts = name.split(".")
    if parts[0] != "dsv4kit":
        return None
    base = FARM.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _bound_names(path: Path) -> set[str]:
    """Names a module binds at its top level (through if/try/with blocks too)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                       ast.ClassDef)):
                    visit(inner)

    visit(ast.parse(path.read_text()).body)
    return names


def _string_value(node) -> str | None:
    """A string literal's text; an f-string's with each {field} as ``_`` (so a script still parses)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "_" for v in node.values)
    return None


def _imports(path: Path, source: str | None = None):
    """(line, imported module, names or None) for every dsv4kit import in ``path``, lazy ones too,
    and in the Python code strings it runs (``python -c`` scripts, box-side scripts)."""
    tree = ast.parse(path.read_text() if source is None else source)
    for node in ast.walk(tree):
        code = _string_value(node) if source is None else None
        if code and "dsv4kit" in code and "import" in code:
            try:
                ast.parse(code)
            except SyntaxError:
                continue
            for line, module, names in _imports(path, code):
                yield node.lineno, module, names
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dsv4kit":
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "dsv4kit":
            yield node.lineno, node.module, [a.name for a in node.names]


def test_the_package_list_is_the_tree():
    packages = {module_name(p.parent / "__init__.py") for p in _source_files("toolkit", "kernels", "validation")
                if (p.parent / "__init__.py").is_file()}
    assert sorted(PYPROJECT["packages"]) == sorted(packages)


def test_the_link_farm_mirrors_package_dir():
    expected = {p.name: p for p in (REPO / "toolkit").iterdir() if p.name != "__pycache__"}
    expected.update({"kernels": REPO / "kernels", "validation": REPO / "validation"})
    found = {p.name: p for p in FARM.iterdir()}
    assert sorted(found) == sorted(expected), "re-run the link commands in docs/architecture.md"
    for name, link in found.items():
        assert link.is_symlink() and not Path(link.readlink()).is_absolute(), name
        assert link.resolve() == expected[name].resolve(), name


@pytest.mark.parametrize("path", _source_files("toolkit", "kernels", "validation", "tests"),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_dsv4kit_import_resolves_statically(path):
    problems = []
    for line, module, names in _imports(path):
        target = _module_file(module)
        if target is None and module in MEANT_TO_BE_MISSING:
            continue
        if target is None:
            problems.append(f"{line}: no module {module}")
            continue
        for name in names or ():
            if name != "*" and _module_file(f"{module}.{name}") is None and name not in _bound_names(target):
                problems.append(f"{line}: {module} has no {name}")
    # Dotted names in strings (mock targets, -m modules): the longest module prefix, then one attribute.
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"dsv4kit(\.\w+)+",
                                                                                             node.value):
            if node.value in MEANT_TO_BE_MISSING:
                continue
            parts = node.value.split(".")
            for cut in range(len(parts), 0, -1):
                target = _module_file(".".join(parts[:cut]))
                if target is not None:
                    break
            rest = parts[cut:]
            if target is None or len(rest) > 1 or (rest and rest[0] not in _bound_names(target)
                                                    and _module_file(node.value) is None):
                problems.append(f"{node.lineno}: the string {node.value!r} names nothing")
    assert not problems, "\n".join(problems)


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    if module in ("dsv4kit", "dsv4kit._version"):
        return "root", LAYER["root"]
    if len(parts) == 2:  # dsv4kit.cli, dsv4kit.sglang_plugin: entry modules
        return "entry", LAYER["entry"]
    return parts[1], LAYER[parts[1]]


def _edges() -> list[tuple[str, str, int]]:
    edges = []
    for name, path in PRODUCT.items():
        for line, module, names in _imports(path):
            targets = [module]
            for n in names or ():
                if f"{module}.{n}" in PRODUCT:
                    targets = [t for t in targets if t != module] + [f"{module}.{n}"]
            edges += [(name, t, line) for t in targets if t in PRODUCT and t != name]
    return edges


def test_every_module_has_a_layer():
    for name in PRODUCT:
        _layer(name)


def test_imports_run_one_way():
    wrong = []
    for src, dst, line in _edges():
        (src_group, src_layer), (dst_group, dst_layer) = _layer(src), _layer(dst)
        if dst_group == "commands" and src_group != "entry" and src_group != "commands":
            wrong.append(f"{src}:{line} imports the command module {dst}")
        elif dst_layer < src_layer:
            wrong.append(f"{src}:{line} ({src_group}) imports {dst} ({dst_group}), which is above it")
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_between_modules():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in _edges():
        graph.setdefault(src, set()).add(dst)
    assert _cycles(graph) == []


def test_no_import_circles_between_capabilities():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in _edges():
        a, b = _layer(src)[0], _layer(dst)[0]
        if a != b:
            graph.setdefault(a, set()).add(b)
    assert _cycles(graph) == []


def test_command_functions_are_thin():
    long = []
    for path in (REPO / "toolkit" / "commands").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_COMMAND_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name}: {length} lines")
    assert not long, "\n".join(long)


def _private_uses(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) for each underscore name of another package that ``path`` reaches:
    ``from dsv4kit.x.y import _z`` and ``m._z`` where ``m`` is a dsv4kit module of another package
    (``import dsv4kit.x.y as m``, ``from dsv4kit.x import y``). Dunder names are public."""
    own = _layer(module_name(path))[0]
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    found = []

    def private(name: str) -> bool:
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("dsv4kit."):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in PRODUCT:
                    aliases[alias.asname or alias.name] = full
                elif private(alias.name) and node.module in PRODUCT and _layer(node.module)[0] != own:
                    found.append((node.lineno, full))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in PRODUCT:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in aliases and _layer(aliases[base.id])[0] != own:
                found.append((node.lineno, f"{aliases[base.id]}.{node.attr}"))
    return found


def test_no_package_uses_another_packages_private_names():
    """An underscore name is its package's own: what two packages share gets a public name in its home."""
    wrong = [f"{name}:{line} uses {used}" for name, path in PRODUCT.items() for line, used in _private_uses(path)]
    assert not wrong, "\n".join(wrong)


def test_the_private_name_rule_sees_both_forms(tmp_path, monkeypatch):
    """Not vacuous: an imported underscore name and an attribute through a module alias are both found."""
    folder = tmp_path / "toolkit" / "quality"
    folder.mkdir(parents=True)
    bad = folder / "bad.py"
    bad.write_text("from dsv4kit.bench.run import " + "_check_repo\n" + "from dsv4kit.bench import sweep\n"
                   + "from dsv4kit.quality import prompts\n" + "x = sweep." + "_context_of, prompts._own\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert [used for _, used in _private_uses(bad)] == ["dsv4kit.bench.run." + "_check_repo",
                                                        "dsv4kit.bench.sweep." + "_context_of"]


# Run on the box, where the standard library may be all there is (docs/architecture.md).
BOX_SIDE = ("dsv4kit.rollout.status", "dsv4kit.rollout.targets", "dsv4kit.rollout.plugin", "dsv4kit.rollout.__main__",
            "dsv4kit.serving.box.http", "dsv4kit.serving.box.metrics", "dsv4kit.serving.box.telemetry",
            "dsv4kit.serving.box.probe", "dsv4kit.serving.box.point", "dsv4kit.serving.box.__main__", "dsv4kit.profile.box_profile", "dsv4kit.quality.box_eval",
            "dsv4kit.quality.prompts", "dsv4kit.quality.api_prompts", "dsv4kit.core.unit_env", "dsv4kit.core.missing", "dsv4kit.core.exitcodes",
            "dsv4kit.sglang_plugin", "dsv4kit", "dsv4kit._version")


@pytest.mark.parametrize("module", [*BOX_SIDE, *(m for m in PRODUCT if PRODUCT[m].name == "__init__.py")])
def test_box_side_modules_import_only_the_standard_library_at_top_level(module):
    tree = ast.parse(PRODUCT[module].read_text())
    tops = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            tops += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            tops += [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in PRODUCT else node.module
                     for a in node.names]
        elif isinstance(node, ast.If):  # box.probe: the package import or the copied file
            tops += [a.name for n in ast.walk(node) if isinstance(n, ast.Import) for a in n.names]
    outside = [t for t in tops if t.split(".")[0] not in sys.stdlib_module_names
               and not (t.split(".")[0] == "dsv4kit" and (t in BOX_SIDE or f"{t}.__init__" in BOX_SIDE))
               and t.split(".")[0] not in ("unit_env", "prompts", "api_prompts", "dsv4box")]  # copied beside the box-side file
    assert not outside, f"{module} imports {outside} at its top level"


def test_the_checker_sees_a_broken_import(tmp_path, monkeypatch):
    """The static check is not vacuous: a misspelt module and a missing name are both reported."""
    bad = tmp_path / "bad.py"
    # Split so that this file's own strings are no code the check would read.
    bad.write_text("from dsv4kit.bench import " + "no_such_module\n" + "from dsv4kit.core.exitcodes import " + "NOPE\n"
                   + "import " + "dsv4kit.rollout.nothing\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    with pytest.raises(AssertionError) as info:
        test_every_dsv4kit_import_resolves_statically(bad)
    assert "no_such_module" in str(info.value) and "NOPE" in str(info.value) and "rollout.nothing" in str(info.value)


def test_no_test_folder_shadows_the_standard_library():
    """Scripts run from tests/ (the stand-in servers, the rollout scenarios) have it first on sys.path."""
    shadowing = [p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name in sys.stdlib_module_names]
    assert not shadowing
