"""Layer rules: a module imports only the project layers its row of docs/design.md allows.

The rules are the table of the section `## Layers` in docs/design.md: first column the layer
(`emu/`, `tasks.py`), third column the layers it may import (`contracts/`, ...; `—` for none).
A layer may always import itself. Every `import` and `from ... import` of every .py file of
every layer is checked, also those inside functions or under TYPE_CHECKING; imports of
anything that is not the project's (the standard library, third-party packages) are not
judged here. Each top-level directory holding .py files, and each top-level .py file, must be
a row of the table; tests/ is not a layer (tests may import every layer).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

DESIGN = REPO / "docs" / "design.md"
NOT_LAYERS = {"tests"}  # top-level names with .py files that the table does not govern
NONE = {"—", "-", "–", "none"}


class LayerTableError(ValueError):
    pass


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _name(text: str) -> str:
    """`emu/` -> emu, `emu/config/` -> emu/config, `tasks.py` -> tasks."""
    return text.strip().strip("`").rstrip("/").removesuffix(".py")


def parse_layers(markdown: str) -> dict[str, set[str]]:
    """The `## Layers` table: layer (a path, `emu/config`) -> the other layers it may import."""
    m = re.search(r"^## Layers[ \t]*\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    if not m:
        raise LayerTableError("no section '## Layers'")
    rows = [ln for ln in m.group(1).splitlines() if ln.lstrip().startswith("|")]
    body = [r for r in rows[1:] if not re.fullmatch(r"[\s|:\-]+", r)]  # past the header and separator
    if not body:
        raise LayerTableError("the section '## Layers' has no table")
    rules: dict[str, set[str]] = {}
    for row in body:
        cells = _cells(row)
        if len(cells) < 3:
            raise LayerTableError(f"row with fewer than 3 columns: {row.strip()}")
        layer, allowed = _name(cells[0]), cells[2]
        names = re.findall(r"`([^`]+)`", allowed)
        if not names and allowed.strip().lower() not in NONE:
            raise LayerTableError(f"{cells[0]}: third column {allowed!r} names no layer in backticks and is not '—'")
        if layer in rules:
            raise LayerTableError(f"{cells[0]}: two rows")
        rules[layer] = {_name(n) for n in names}
    unknown = {f"{layer} -> {a}" for layer, allowed in rules.items() for a in allowed if a not in rules}
    if unknown:
        raise LayerTableError(f"allowed layers that are not rows of the table: {sorted(unknown)}")
    return rules


def layer_of(path: str, rules: dict[str, set[str]]) -> str | None:
    """The most specific row that holds `path` (`emu/config/plan`, a file or module path without suffix)."""
    parts = path.split("/")
    for n in range(len(parts), 0, -1):
        if "/".join(parts[:n]) in rules:
            return "/".join(parts[:n])
    return None


def project_files(root: Path) -> list[Path]:
    """Every .py file of the project but tests/: those under top-level directories, and top-level ones."""
    out: list[Path] = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or p.name in ("results", "__pycache__") or p.name in NOT_LAYERS:
            continue
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.py") if "__pycache__" not in f.parts)
        elif p.suffix == ".py":
            out.append(p)
    return out


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module as a path: `emu/config/plan`) of every import in a file; relative imports resolved
    from its package; `from pkg import name` counts as importing `pkg/name` (a module or a name in pkg)."""
    rel = path.relative_to(root)
    package = list(rel.parts[:-1])  # the package a relative import starts from
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.replace(".", "/")) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module.split(".")
            elif node.level - 1 <= len(package):
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            else:
                base = node.module.split(".") if node.module else []
            out += [(node.lineno, "/".join(base + [a.name])) for a in node.names]
    return out


def violations(root: Path, rules: dict[str, set[str]]) -> list[str]:
    files = project_files(root)
    problems = []
    for f in files:
        rel = f.relative_to(root)
        if layer_of(str(rel.with_suffix("")), rules) is None:
            where = f"{rel.parts[0]}/" if len(rel.parts) > 1 else str(rel)
            problems.append(f"{where}: holds .py files but is not a row of the layer table")
    problems = sorted(set(problems))
    tops = {f.relative_to(root).parts[0].removesuffix(".py") for f in files} | {r.split("/")[0] for r in rules}
    for path in files:
        layer = layer_of(str(path.relative_to(root).with_suffix("")), rules)
        if layer is None:
            continue
        for line, module in imported_modules(path, root):
            if module.split("/")[0] not in tops:
                continue  # the standard library, a third-party package
            target = layer_of(module, rules)
            if target is None or target == layer:
                continue
            if not any(target == a or target.startswith(a + "/") for a in rules[layer]):
                may = ", ".join(sorted(rules[layer])) or "no other layer"
                problems.append(f"{path.relative_to(root)}:{line}: imports {target} ({layer} may import: {may})")
    return problems


def test_every_import_respects_the_layer_table():
    assert DESIGN.exists(), f"{DESIGN.relative_to(REPO)} is missing: it holds the layer table"
    rules = parse_layers(DESIGN.read_text())
    problems = violations(REPO, rules)
    assert not problems, "imports the layer table of docs/design.md (## Layers) forbids:\n" + "\n".join(problems)


# The checker itself, on a made-up tree: it must see what it is there to see.
TABLE = """# design

## Layers

| layer | what it is | may import (project layers) |
|---|---|---|
| `contracts/` | leaf \\| typed | — |
| `emu/` | the testbed | `contracts/` |
| `workloads/` | the worker | `schedulers/`, `contracts/` |
| `schedulers/` | schedulers | `contracts/` |
| `tasks.py` | tasks | `emu/`, `workloads/`, `schedulers/`, `contracts/` |

## Next section

| `bench/` | not part of the table | `emu/` |
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


CLEAN = {
    "contracts/__init__.py": "import json\nfrom pydantic import BaseModel\n",
    "emu/__init__.py": "",
    "emu/runner.py": "import contracts.role_spec\nfrom contracts import x\nfrom . import config\n"
                     "from .config import y\n",
    "emu/config.py": "import yaml\n",
    "schedulers/base.py": "from contracts.role_spec import RoleSpec\n",
    "workloads/worker.py": "from schedulers import base\nimport contracts\n",
    "tasks.py": "from emu import runner\nimport workloads.worker\n",
    "tests/unit/test_x.py": "import emu, workloads, schedulers, contracts, tasks\n",
}


def test_parse_layers_reads_the_table():
    rules = parse_layers(TABLE)
    assert rules == {"contracts": set(), "emu": {"contracts"}, "workloads": {"schedulers", "contracts"},
                     "schedulers": {"contracts"}, "tasks": {"emu", "workloads", "schedulers", "contracts"}}


def test_clean_tree_passes(tmp_path):
    assert violations(_tree(tmp_path, CLEAN), parse_layers(TABLE)) == []


def test_upward_and_sideways_imports_are_named_by_file_and_line(tmp_path):
    root = _tree(tmp_path, {**CLEAN,
                            "emu/runner.py": "import contracts\n\n\ndef f():\n    import workloads.worker\n",
                            "contracts/__init__.py": "from emu.config import y\n",
                            "schedulers/base.py": "from .. import workloads\n",
                            "emu/sub/deep.py": "from ...schedulers import base\n"})
    assert sorted(violations(root, parse_layers(TABLE))) == [
        "contracts/__init__.py:1: imports emu (contracts may import: no other layer)",
        "emu/runner.py:5: imports workloads (emu may import: contracts)",
        "emu/sub/deep.py:1: imports schedulers (emu may import: contracts)",
        "schedulers/base.py:1: imports workloads (schedulers may import: contracts)",
    ]


def test_a_package_missing_from_the_table_fails(tmp_path):
    root = _tree(tmp_path, {**CLEAN, "bench/b.py": "import emu\n", "tool.py": "import emu\n"})
    assert violations(root, parse_layers(TABLE)) == [
        "bench/: holds .py files but is not a row of the layer table",
        "tool.py: holds .py files but is not a row of the layer table"]


def test_a_missing_or_broken_table_fails():
    for text, message in [
        ("# design\n\n## Architecture\n", "no section '## Layers'"),
        ("## Layers\n\nprose only\n\n## Next\n| `a/` | b | — |\n", "has no table"),
        (TABLE.replace("typed | — |", "typed | nothing |"), "names no layer in backticks"),
        (TABLE.replace("`schedulers/`, `contracts/` |", "`schedulrs/`, `contracts/` |"),
         "not rows of the table: ['tasks -> schedulrs', 'workloads -> schedulrs']"),
    ]:
        try:
            parse_layers(text)
        except LayerTableError as e:
            assert message in str(e), (message, str(e))
        else:
            raise AssertionError(f"accepted: {message}")


def test_no_function_is_over_80_lines():
    """Functions in the harness's layers read top to bottom on one screen or two."""
    long = []
    for layer in ("emu", "workloads", "schedulers", "analysis", "contracts"):
        for path in sorted((REPO / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    if n > 80:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)


def test_sub_packages_are_layers_of_their_own(tmp_path):
    """A row for a sub-package governs its files; a row naming a parent allows all of its sub-packages."""
    table = TABLE.replace("| `emu/` | the testbed | `contracts/` |",
                          "| `emu/` | map | — |\n| `emu/low/` | low | `contracts/` |\n"
                          "| `emu/high/` | high | `emu/low/`, `contracts/` |")
    root = _tree(tmp_path, {**{k: v for k, v in CLEAN.items() if not k.startswith("emu/")},
                            "emu/__init__.py": "", "emu/low/a.py": "from emu.high import b\n",
                            "emu/high/b.py": "from emu.low import a\nfrom . import c\n", "emu/high/c.py": "",
                            "tasks.py": "from emu.high.b import x\n"})
    assert violations(root, parse_layers(table)) == [
        "emu/low/a.py:1: imports emu/high (emu/low may import: contracts)"]
