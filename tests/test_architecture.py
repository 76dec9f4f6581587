"""The shape of the code: who may import whom (DESIGN.md, "Layout" and "Inside trainer/")."""

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "collectors", "trainer", "checkpoints", "benchmarks")
LIBRARIES = ("envs", "collectors", "trainer", "checkpoints")  # what the command lines and benchmarks build on
COMMAND_LINES = {"trainer.train", "trainer.evaluate", "trainer.export", "trainer.batching", "trainer.compare",
                 "trainer.sweep"}


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
    assert "trainer.registry" in graph["trainer.train"]  # the graph sees imports
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
    lines ``trainer.export`` and ``trainer.batching`` are PPO's)."""
    algorithm_specific = ("trainer.ppo", "trainer.apex", "trainer.registry", "trainer.export", "trainer.batching")
    graph, sources = import_graph(), modules()
    for name, targets in graph.items():
        if not name.startswith("trainer") or name.startswith(algorithm_specific):
            continue
        assert not {t for t in targets if t.startswith(("trainer.ppo", "trainer.apex"))}, name
        text = sources[name].read_text()
        assert ".algo ==" not in text and ".algo !=" not in text and ".algo in " not in text, name


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
