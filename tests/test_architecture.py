"""The shape of the code: who may import whom (docs/README.md, "The code"; the layout is fixed), how long a
function may be, and that docstrings name what exists."""

import ast
import builtins
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "collectors", "trainer", "checkpoints", "benchmarks")
LIBRARIES = ("envs", "collectors", "trainer", "checkpoints")  # what the command lines and benchmarks build on
COMMAND_LINES = {"trainer.train", "trainer.evaluate", "trainer.export", "trainer.batching", "trainer.compare",
                 "trainer.sweep", "trainer.distill"}


def modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that importing ``name`` runs: its imports at any depth (in functions too: a circle
    through a lazy import is still a circle), and the packages above them, except under ``if TYPE_CHECKING``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:  # `from a import b` imports the module a.b where there is one
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    ran = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            ran.add(".".join(parts[:i]))
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}  # already running
    return {m for m in ran if m in known and m not in own and m != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_import_circle_anywhere():
    graph = import_graph()
    assert "trainer.flags" in graph["trainer.train"]  # the graph sees imports
    assert circles(graph) == []


def test_a_circle_would_be_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_only_downward():
    graph = import_graph()
    for name, targets in graph.items():
        top = name.split(".")[0]
        allowed = {"trainer": {"trainer", "collectors", "envs", "checkpoints"}, "benchmarks": set(PACKAGES)}.get(
            top, {top})
        assert {t.split(".")[0] for t in targets} <= allowed, name


def test_no_library_module_imports_a_command_line():
    for name, targets in import_graph().items():
        if name.split(".")[0] in LIBRARIES and name not in COMMAND_LINES:
            assert not targets & COMMAND_LINES, name


def test_only_the_registry_knows_the_algorithms():
    """The loop, evaluation and the shared modules reach an algorithm through ``trainer.registry`` only: they
    import nothing of ``trainer.ppo`` or ``trainer.apex`` and never compare ``cfg.algo`` (the PPO-only command
    lines ``trainer.export``, ``trainer.distill`` and ``trainer.batching`` are PPO's)."""
    algorithm_specific = ("trainer.ppo", "trainer.apex", "trainer.registry", "trainer.export", "trainer.distill",
                          "trainer.batching")
    graph, sources = import_graph(), modules()
    for name, targets in graph.items():
        if not name.startswith("trainer") or name.startswith(algorithm_specific):
            continue
        assert not {t for t in targets if t.startswith(("trainer.ppo", "trainer.apex"))}, name
        text = sources[name].read_text()
        assert ".algo ==" not in text and ".algo !=" not in text and ".algo in " not in text, name


def test_the_shared_modules_import_nothing_of_the_runs_config():
    """``trainer.common`` serves both algorithms and the loop: it takes ``ConfigError`` from its home
    (``envs.settings``), not through ``trainer.config``, which would pull in the registry and every algorithm."""
    run_config = {"trainer.config", "trainer.registry", "trainer.flags"}
    shared = {name: targets for name, targets in import_graph().items() if name.startswith("trainer.common")}
    assert shared and all(not targets & run_config for targets in shared.values()), shared


def test_the_ape_x_ray_worker_imports_only_what_an_actor_needs():
    code = ("import sys, trainer.apex.ray_worker\n"
            "print('\\n'.join(sorted(sys.modules)))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "trainer.apex.ray_worker" in loaded and "trainer.apex.dqn" in loaded
    learner_side = {m for m in loaded if m == "checkpoints" or m.startswith(("checkpoints.", "trainer.ppo"))}
    learner_side |= loaded & {"trainer.apex.algorithm", "trainer.apex.replay", "trainer.registry", "trainer.train",
                              "trainer.run_files", "trainer.evaluation", "ray"}
    assert learner_side == set()


MAX_FUNCTION_LINES = 50  # a function longer than a screen is split into named parts that say what they return


def function_lengths(path: Path) -> dict[str, int]:
    """Each function of the module at ``path`` (methods and nested functions too), by qualified name: its length
    in lines, from ``def`` to its last line (the docstring included)."""
    lengths = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return lengths


def too_long_functions() -> dict[str, int]:
    """The library's functions over ``MAX_FUNCTION_LINES``, as ``path:name`` -> lines."""
    return {f"{path.relative_to(REPO).as_posix()}:{name}": lines
            for package in LIBRARIES for path in sorted((REPO / package).rglob("*.py"))
            for name, lines in function_lengths(path).items() if lines > MAX_FUNCTION_LINES}


def test_no_library_function_is_longer_than_a_screen():
    assert too_long_functions() == {}


def test_a_long_function_would_be_found(tmp_path):
    module = tmp_path / "module.py"
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    module.write_text(f"class C:\n    def long(self):\n{body}\n\ndef short():\n    def inner():\n        pass\n")
    assert function_lengths(module) == {"C.long": MAX_FUNCTION_LINES + 1, "short": 3, "short.inner": 2}


# ---------------------------------------------------------------------------- docstrings name what exists

REFERENCE = re.compile(r":(?:func|class|mod|meth|attr|data|exc):`~?\.?([\w.]+)`|``([A-Za-z_][\w.]*)\(\)``")


@dataclass
class Namespace:
    """What a module defines at its top (``names``; an import's name -> what it imports in ``imported``) and
    what each of its classes defines (methods, class attributes, ``self.x`` attributes)."""

    names: set[str] = field(default_factory=set)
    imported: dict[str, str] = field(default_factory=dict)
    members: dict[str, set[str]] = field(default_factory=dict)


def namespace(path: Path) -> Namespace:
    found, tree = Namespace(), ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found.members[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef,
                                        ast.AsyncFunctionDef, ast.ClassDef))} | assigned(node)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                found.imported[name] = (f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom)
                                        else alias.name if alias.asname else name)
    found.names |= assigned(tree) | set(found.imported)
    return found


def assigned(node: ast.AST) -> set[str]:
    """The names ``node``'s body assigns (``x = ...``, ``x: T = ...``) and the attributes its methods set on
    ``self``; for a module, also what an ``if`` or ``try`` at the top assigns."""
    names = set()
    for child in ast.walk(node):
        for target in (child.targets if isinstance(child, ast.Assign) else
                       [child.target] if isinstance(child, (ast.AnnAssign, ast.AugAssign)) else []):
            for t in ast.walk(target):
                if isinstance(t, ast.Name) and child in getattr(node, "body", []) + nested_top(node):
                    names.add(t.id)
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def nested_top(node: ast.AST) -> list[ast.AST]:
    """The statements under an ``if``/``try``/``with`` at the top of ``node`` (a module's optional imports)."""
    out = []
    for child in getattr(node, "body", []):
        if isinstance(child, (ast.If, ast.Try, ast.With)):
            out += [s for block in (child.body, getattr(child, "orelse", []), getattr(child, "finalbody", []),
                                    *(h.body for h in getattr(child, "handlers", []))) for s in block]
    return out


def resolves(reference: str, module: str, spaces: dict[str, Namespace],
             arguments: frozenset[str] = frozenset()) -> bool:
    """Whether ``reference`` (dotted, or a bare name) names something that exists: a project module, a name in
    one (a class's member too), what ``module`` imports under that name, one of the documented function's
    ``arguments``, a builtin, or an installed module's attribute."""
    first, *rest = reference.split(".")
    here = spaces[module]
    if first in arguments:
        return True
    if first in ("self", "cls") and rest:
        return any(rest[0] in members for members in here.members.values())
    if not rest:
        return (first in here.names or f"{module}.{first}" in spaces or f"{module.rpartition('.')[0]}.{first}" in
                spaces or any(first in m for m in here.members.values()) or hasattr(builtins, first) or
                not first.startswith("_") and any(first in n.names or any(first in m for m in n.members.values())
                                                  for n in spaces.values()))  # a private name is its module's
    if here.imported.get(first, first) != first:  # an imported name (np, TrainConfig): what it names, then the rest
        return resolves(".".join([here.imported[first], *rest]), module, spaces)
    if first in here.members and len(rest) == 1:  # a class's member, or one it inherits
        return rest[0] in here.members[first] or inherited(module, first, rest[0])
    parts = reference.split(".")
    for i in range(len(parts), 0, -1):  # the longest project module it begins with
        if ".".join(parts[:i]) in spaces:
            owner, left = spaces[".".join(parts[:i])], parts[i:]
            if not left:
                return True
            if left[0] in owner.imported and len(left) > 1:
                return resolves(".".join([owner.imported[left[0]], *left[1:]]), module, spaces)
            if left[0] in owner.names and (len(left) == 1 or left[1] in owner.members.get(left[0], {left[1]})):
                return True
            break  # a name a package makes on first use (its __getattr__): imported
    return installed_attribute(first, rest)


def inherited(module: str, cls: str, member: str) -> bool:
    """Whether the class ``cls`` of the project module ``module`` has ``member`` from a base class."""
    try:
        return hasattr(getattr(importlib.import_module(module), cls), member)
    except ImportError:
        return False


def installed_attribute(package: str, rest: list[str]) -> bool:
    """Whether ``package.rest...`` exists in an installed package (one that is not installed: taken on trust)."""
    try:
        value = importlib.import_module(package)
    except ImportError:
        return package.split(".")[0] not in sys.stdlib_module_names and importlib.util.find_spec(
            package.split(".")[0]) is None
    for name in rest:
        if not hasattr(value, name):
            try:
                value = importlib.import_module(f"{value.__name__}.{name}")
                continue
            except (ImportError, AttributeError):
                return False
        value = getattr(value, name)
    return True


def docstrings(path: Path) -> list[tuple[int, str, frozenset[str]]]:
    """Each docstring of the module at ``path`` (its own, its classes' and functions'), with its line and the
    names of its function's arguments."""
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef,
                                                                     ast.AsyncFunctionDef)))]
    return [(getattr(n, "lineno", 1), text, frozenset(a.arg for a in ast.walk(n.args) if isinstance(a, ast.arg))
             if hasattr(n, "args") else frozenset()) for n in nodes if (text := ast.get_docstring(n, clean=False))]


def unresolved_references(paths: dict[str, Path]) -> list[str]:
    spaces = {name: namespace(path) for name, path in paths.items()}
    return [f"{name}:{line}: {ref}"
            for name, path in paths.items() for line, text, arguments in docstrings(path)
            for match in REFERENCE.finditer(text) if not resolves(ref := match[1] or match[2], name, spaces,
                                                                  arguments)]


def test_docstrings_name_what_exists():
    """Every ``:func:`name``` (``:class:``, ``:mod:``, ``:meth:``...) and backticked ``name()`` of the library's
    docstrings names a module, function, class or attribute that exists (a renamed one leaves none behind)."""
    library = {name: path for name, path in modules().items() if name.split(".")[0] in LIBRARIES}
    assert unresolved_references(library) == []


def test_a_reference_to_nothing_would_be_found(tmp_path):
    (tmp_path / "mod.py").write_text('"""See :func:`helper`, :func:`gone`, ``Thing.run()`` and ``Thing.stop()``, '
                                     ':mod:`envs.settings` and :class:`envs.settings.Nothing`."""\n\n'
                                     'def helper():\n    pass\n\n\nclass Thing:\n    def run(self):\n        pass\n')
    found = unresolved_references({"mod": tmp_path / "mod.py"})
    assert [f.rpartition(": ")[2] for f in found] == ["gone", "Thing.stop", "envs.settings.Nothing"]
