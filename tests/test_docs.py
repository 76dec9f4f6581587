"""The documentation stays true: every module's docstring examples run, and every page of the manual (README.md and
docs/*.md) has links that lead somewhere, commands its programs accept and Python examples that run."""

import contextlib
import doctest
import importlib
import io
import itertools
import os
import re
import runpy
import shlex
import subprocess
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "collectors", "trainer", "checkpoints", "benchmarks")
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]

# A page's code block preceded by `<!-- docs-test: REASON -->` is compiled, not run; these are the reasons allowed:
NOT_RUN_HERE = frozenset({
    "run by tests/test_load_policy.py",  # the README's three lines need a trained run and an observation
    "run by tests/test_export.py",  # the ONNX example needs a trained run exported as ONNX, which that test makes
})


# ---------------------------------------------------------------------------- docstrings

def modules_with_examples() -> list[str]:
    """Dotted names of the modules whose source holds a doctest prompt (found by reading, not importing)."""
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if ">>> " in path.read_text():
                parts = path.relative_to(REPO).with_suffix("").parts
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_modules_with_examples_are_found():
    found = modules_with_examples()
    assert {"trainer.ppo.pipeline", "trainer.ppo.model", "collectors.rollout", "envs.vr_edge"} <= set(found)


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no examples left"
    assert result.failed == 0


# ---------------------------------------------------------------------------- reading a page

FENCE = re.compile(r"^(?:<!-- docs-test: (?P<marker>.+?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`]+)`")  # inline code; it may wrap onto the next line
COMMAND_START = re.compile(r"(\.venv/bin/)?python3? -m |make ")


def prose(text: str) -> str:
    """The page without its code blocks (a `#` line or a `](` in a block is code, not a heading or a link)."""
    return FENCE.sub("", text)


def code_blocks(page: str, lang: str) -> list[re.Match]:
    return [m for m in FENCE.finditer((REPO / page).read_text()) if m["lang"] == lang]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown file's headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    found, times = set(), {}
    for heading in re.findall(r"^#+ (.+)$", prose(path.read_text()), re.M):
        base = slug(heading)
        found.add(f"{base}-{times[base]}" if base in times else base)
        times[base] = times.get(base, 0) + 1
    return frozenset(found)


def unresolved(target: str, base: Path) -> str | None:
    """Why a relative link ``target`` (``path``, ``path#anchor`` or ``#anchor``) from a file in ``base`` leads
    nowhere; ``None`` when it resolves. Links to other sites are not followed (no network in the tests)."""
    if re.match(r"[a-z]+:", target):
        return None
    file, _, anchor = target.partition("#")
    path = (base / file).resolve() if file else base
    if not path.exists():
        return f"{target}: no such file"
    if anchor and anchor not in anchors(path):
        return f"{target}: {path.name} has no heading with that anchor"
    return None


def broken_links(page: Path) -> list[str]:
    return [why for target in LINK.findall(prose(page.read_text()))
            if (why := unresolved(target, page if target.startswith("#") else page.parent))]


# ---------------------------------------------------------------------------- links

@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page):
    assert broken_links(REPO / page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [file](missing.md) [anchor](#nowhere) [site](https://example.org)\n"
                    "## Top\n\n[second](#top-1) [third](#top-2)\n```bash\nx[0](#in-code)\n```\n")
    assert broken_links(page) == ["missing.md: no such file", "#nowhere: page.md has no heading with that anchor",
                                  "#top-2: page.md has no heading with that anchor"]


def test_anchors_named_in_code_resolve():
    """Comments, messages and the changelog point at the manual as ``docs/<page>.md#<anchor>``, from the
    repository's root."""
    sources = [*sorted(p for d in (*PACKAGES, "tests") for p in (REPO / d).rglob("*.py")),
               REPO / "Makefile", REPO / "CHANGELOG.md"]
    named = {(src.name, target) for src in sources for target in re.findall(r"[\w./-]+\.md#[\w-]+", src.read_text())}
    assert named, "no source points at an anchor of the manual any more: this test reads nothing"
    assert [(name, why) for name, target in sorted(named) if (why := unresolved(target, REPO))] == []


def test_tables_name_functions_their_files_define():
    """A table row that links Python files ("where the math lives") names, in code, what one of them defines."""
    rows = [(page, row) for page in PAGES for row in re.findall(r"^\|.*\.py\).*\|$", (REPO / page).read_text(), re.M)]
    assert rows, "no table links a Python file any more: this test reads nothing"
    missing = []
    for page, row in rows:
        sources = " ".join((REPO / page).parent.joinpath(t).read_text() for t in LINK.findall(row) if t.endswith(".py"))
        missing += [f"{page}: {name}" for name in re.findall(r"`(\w+)`", row)
                    if not re.search(rf"^\s*(def|class) {name}\b", sources, re.M)]
    assert missing == []


# ---------------------------------------------------------------------------- commands

def shell_words(line: str) -> list[str]:
    """A shell line's words, comments dropped; `;`, `&&`, `|`, `>` ... come out as words of their own."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def shell_lines(script: str) -> list[str]:
    return script.replace("\\\n", " ").splitlines()  # a line continued with a backslash is one line


def commands(page: str) -> list[str]:
    """The lines of the page's bash blocks (continuations joined) and its inline code that starts a command (a page
    quotes a past revision's command without ``python -m``, so that it is not taken for one of today's)."""
    text = (REPO / page).read_text()
    lines = [line for m in code_blocks(page, "bash") for line in shell_lines(m["body"])]
    spans = [" ".join(span.split()) for span in SPAN.findall(prose(text))]
    return [line for line in lines if line.strip()] + [span for span in spans if COMMAND_START.match(span)]


def test_commands_name_the_interpreter_that_setup_made():
    """A line of the manual's bash blocks (what a user pastes) runs Python, torchrun or pip as ``.venv/bin/...``:
    a bare ``python`` or ``torchrun`` is not found, or is another interpreter, outside an activated venv. (Prose
    names a command as ``python -m ...`` and may.)"""
    lines = [(page, line) for page in PAGES
             for block in code_blocks(page, "bash") for line in shell_lines(block["body"])]
    assert len(lines) > 20, "the manual's bash blocks are no longer found: this test reads nothing"
    bare = [(page, line) for page, line in lines
            if (words := shell_words(line)) and re.fullmatch(r"python[\d.]*|torchrun|pip[\d.]*", words[0])]
    assert bare == []


def invocations(line: str) -> list[tuple[str, list[str]]]:
    """``(module, arguments)`` of each ``python -m`` of this project in a shell line; for ``make``, of the recipe it
    would run (``make -n``). Arguments end at a shell operator."""
    words = shell_words(line)
    if words[:1] == ["make"]:
        dry = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, f"{line}: {dry.stderr.strip()}"
        return [call for recipe in shell_lines(dry.stdout) for call in invocations(recipe)]
    found = []
    for i, (python, dash_m, module) in enumerate(zip(words, words[1:], words[2:])):
        if re.fullmatch(r"(.*/)?python[\d.]*", python) and dash_m == "-m" and module.split(".")[0] in PACKAGES:
            rest = words[i + 3:]
            end = next((j for j, w in enumerate(rest) if set(w) <= set("();<>|&")), len(rest))
            found.append((module, rest[:end]))
    return found


def flags(arguments: list[str]) -> list[str]:
    """The ``--flags`` among a command's arguments, up to a ``--`` (what follows is another program's)."""
    mine = arguments[:arguments.index("--")] if "--" in arguments else arguments
    return [a.split("=", 1)[0] for a in mine if a.startswith("--") and len(a) > 2]


@cache
def help_text(module: str, *words: str) -> str:
    """``python -m module [words] --help`` (``words``: a subcommand), run in this process (torch is imported once,
    not once per module)."""
    out = io.StringIO()
    with (contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done, warnings.catch_warnings()):
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before, as a library
        sys_argv, sys.argv = sys.argv, [module, *words, "--help"]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        finally:
            sys.argv = sys_argv
    assert done.value.code in (0, None) and "usage:" in out.getvalue(), f"{module} {' '.join(words)} --help failed"
    return out.getvalue()


def listed(flag: str, module: str, arguments: list[str]) -> bool:
    """Whether the help of ``module`` (of its subcommand, when the arguments start with one) names ``flag``."""
    words = itertools.takewhile(lambda a: not a.startswith("-"), arguments)
    return re.search(rf"{re.escape(flag)}(?![\w-])", help_text(module, *words)) is not None


def module_file(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__main__.py") if p.exists()), None)


@pytest.mark.parametrize("page", PAGES)
def test_commands_name_programs_and_flags_that_exist(page):
    """Each ``python -m`` of this project on the page, typed or run by a ``make`` target, names a module that exists
    and only ``--flags`` its ``--help`` lists. Values are not checked: the pages name runs and hosts that are not
    here (``runs/...``, ``HEAD_IP:6379``)."""
    wrong = []
    for line in commands(page):
        for module, arguments in invocations(line):
            if module_file(module) is None:
                wrong.append(f"{line}: no module {module}")
            elif unknown := [f for f in flags(arguments) if not listed(f, module, arguments)]:
                wrong.append(f"{line}: {module} --help lists no {', '.join(unknown)}")
    assert wrong == []


def test_commands_are_found_in_blocks_inline_and_behind_make():
    found = {module: arguments for line in commands("README.md") for module, arguments in invocations(line)}
    assert "trainer.train" in found and "trainer.export" in found and "trainer.evaluate" in found  # make evaluate
    assert flags(["--a", "x", "--b=1", "--", "--c"]) == ["--a", "--b"]
    assert listed("--seed", "trainer.train", []) and not listed("--see", "trainer.train", [])
    assert listed("--seconds", "benchmarks.apex", ["vr-edge", "--seconds", "300"])  # a subcommand's own flag
    assert invocations("srun python -m trainer.train --seed 1 & wait; python -m pip list") == [
        ("trainer.train", ["--seed", "1"])]


# ---------------------------------------------------------------------------- Python examples

def python_examples() -> list:
    """Each page's Python blocks, an example shown on several pages once; one marked `<!-- docs-test: REASON -->`
    is skipped with that reason."""
    first: dict[str, tuple[str, re.Match]] = {}
    for page in PAGES:
        for m in code_blocks(page, "python"):
            first.setdefault(m["body"], (page, m))
    return [pytest.param(m["body"], id=f"{page}:{(REPO / page).read_text()[:m.start()].count(chr(10)) + 1}",
                         marks=[pytest.mark.skip(reason=m["marker"])] if m["marker"] else [])
            for page, m in first.values()]


@pytest.mark.parametrize("code", python_examples())
def test_python_examples_run(code, tmp_path):
    """Run as a script of its own (``__main__``, so that async workers can import it), in an empty directory."""
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


def test_examples_not_run_here_are_the_known_exceptions_and_compile():
    marked = [(page, m) for page in PAGES for m in FENCE.finditer((REPO / page).read_text()) if m["marker"]]
    assert {m["marker"] for _, m in marked} == NOT_RUN_HERE  # none unexplained, none left over
    for page, m in marked:
        compile(m["body"], f"{page} ({m['marker']})", "exec")


# ---------------------------------------------------------------------------- the manual's size and map

def unreleased_entries(changelog: str) -> list[str]:
    """The physical lines of the changelog's ``Unreleased`` section that are not blank or a heading."""
    section = changelog.split("## Unreleased", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.strip() and not line.startswith("#")]


def test_the_changelog_says_each_change_in_one_line():
    entries = unreleased_entries((REPO / "CHANGELOG.md").read_text())
    assert entries and all(line.startswith("- ") for line in entries), [e for e in entries if not e.startswith("- ")]
    wrapped = "## Unreleased\n### Added\n- a change that goes on\n  to a second line\n## 0.1.0\n"
    assert not all(line.startswith("- ") for line in unreleased_entries(wrapped))  # (it would be found)


def test_the_benchmark_page_holds_at_most_4000_words():
    assert len((REPO / "docs" / "benchmarks.md").read_text().split()) <= 4000


@pytest.mark.parametrize("room", ["envs", "trainer/evaluation", "trainer/ppo"])
def test_the_code_map_names_every_module_of_the_rooms_a_reader_opens_first(room):
    code_map = (REPO / "docs" / "README.md").read_text()
    unnamed = [p.name for p in sorted((REPO / room).glob("*.py"))
               if p.name != "__init__.py" and not re.search(rf"\b{re.escape(p.stem)}(\.py)?\b", code_map)]
    assert unnamed == [], f"docs/README.md's code map names none of {unnamed} in {room}/"
