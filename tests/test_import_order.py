"""Imports flow one way: errors -> trace -> paths -> kernels -> data / verifier / algorithms ->
engine -> store -> metrics -> services -> jobs -> ui / commands, and nothing in the library imports
the worker entry points (``workers/``).

Every ``import`` of a SpecUI module counts, inside functions too: an import moved into a
function to dodge a cycle is still an upward edge, and this test names it.  The layer of a
module is the longest prefix listed below; a module the list does not place fails the test,
so a new module is placed on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _specui(*names: str) -> tuple[str, ...]:
    return tuple(f"specui.{name}" for name in names)


# Lowest first.  A module may import its own layer and any layer below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # Pure definitions every layer may use: errors, the generic registry, the acceptance formulas.
    ("errors", _specui("errors", "registry", "acceptance", "processes", "atomic")),
    ("trace", ("specui.trace",)),
    ("paths", ("specui.paths",)),
    # SpecUI's CPU kernels (C, built at first use) and their bindings: the verifier's and the
    # drafters' alike, so below both; they need only where to build (paths).
    ("kernels", ("specui.kernels",)),
    # What the models are: prompts and data, the verifier, the algorithm packages (with the
    # training abstractions they implement: specui.algorithms.objective and .options).
    ("models", _specui("data", "verifier", "sampling", "algorithms")),
    # The decoding loop and its policy (how many drafts a step sends, from the cost model).
    ("engine", ("specui.engine", "specui.policy")),
    ("store", ("specui.store",)),
    ("metrics", ("specui.metrics",)),
    (
        "services",
        _specui("service", "benchmark", "workbench", "replay", "export", "export_speculators")
        + _specui("training", "vllm", "doctor", "choices"),
    ),
    ("jobs", ("specui.jobs",)),
    ("ui", ("specui.ui", "specui.commands", "specui.cli", "specui.__main__")),
    # Process entry points: they import the library; the library never imports them.
    ("entry points", ("workers", "app")),
]


def layer_of(module: str) -> int | None:
    if module == "specui":
        return 0  # the package itself: its __init__ is empty (a prefix would place every module)
    best: tuple[int, int] | None = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(path: Path, module: str) -> list[tuple[str, int]]:
    """(SpecUI module imported, line) for every import statement in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from specui.verifier import batch_invariant` imports the submodule, not the package.
            subs = [f"{target}.{a.name}" for a in node.names]
            out += [
                (
                    s
                    if layer_of(s) is not None
                    and s.count(".") > target.count(".")
                    and _is_module(s)
                    else target,
                    node.lineno,
                )
                for s in subs
            ]
    return [(m, line) for m, line in out if m.split(".")[0] in ("specui", "workers", "app")]


def _is_module(name: str) -> bool:
    p = REPO.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def sources() -> list[Path]:
    files = sorted((REPO / "specui").rglob("*.py")) + sorted((REPO / "workers").rglob("*.py"))
    return [*files, REPO / "app.py"]


def test_every_module_has_a_layer() -> None:
    unplaced = [module_name(p) for p in sources() if layer_of(module_name(p)) is None]
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_go_down_the_layers(path: Path) -> None:
    module = module_name(path)
    mine = layer_of(module)
    assert mine is not None
    upward = []
    for target, line in imported(path, module):
        theirs = layer_of(target)
        if theirs is None:
            continue  # not a SpecUI module (placed modules are checked above)
        if theirs > mine:
            upward.append(
                f"line {line}: {target} ({LAYERS[theirs][0]}) from a {LAYERS[mine][0]} module"
            )
    assert not upward, f"{module} imports upward:\n  " + "\n  ".join(upward)


def test_no_package_is_split_across_layers() -> None:
    """Each listed prefix is one layer's: none lies inside a prefix another layer lists (a
    package whose modules sit in two layers hides which way its imports may go)."""
    placed = [(p, i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes]
    split = [
        f"{inner} ({LAYERS[i][0]}) inside {outer} ({LAYERS[j][0]})"
        for inner, i in placed
        for outer, j in placed
        if i != j and inner.startswith(outer + ".")
    ]
    assert split == KNOWN_SPLIT, split


# No package is split now: the metric formulas left specui.metrics for specui.acceptance.
KNOWN_SPLIT: list[str] = []


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    """The rule above can fail: an engine module importing the store is named."""
    fake = REPO / "specui" / "engine.py"
    edges = imported(fake, "specui.engine")
    assert all(layer_of(t) is None or layer_of(t) <= layer_of("specui.engine") for t, _ in edges)
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from specui.store import Store\n    from specui import ui\n")
    found = [layer_of(t) for t, _ in imported(bad, "specui.engine")]
    assert found == [layer_of("specui.store"), layer_of("specui.ui")]
    assert all(f > layer_of("specui.engine") for f in found)


def test_tests_import_shared_helpers_only_from_tests_support() -> None:
    """A test module that imports another test module runs that module's fixtures and
    collection side effects too; shared helpers live in tests/support."""
    found = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
            )
            found += [
                f"{path.relative_to(REPO)}: {n}"
                for n in names
                if n.startswith("tests.") and not n.startswith("tests.support")
            ]
    assert not found, found


def test_the_architecture_page_has_a_paragraph_for_every_layer() -> None:
    """docs/architecture.md draws these layers and gives each a paragraph ("**name.**"): a layer
    added here without one there fails."""
    page = (REPO / "docs" / "architecture.md").read_text()
    missing = [name for name, _ in LAYERS if f"**{name}.**" not in page]
    assert not missing, f"docs/architecture.md has no paragraph for {missing}"
