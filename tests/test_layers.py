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
    """`emu/` -> emu, `tasks.py` -> tasks."""
    return text.strip().strip("`").rstrip("/").removesuffix(".py")


def parse_layers(markdown: str) -> dict[str, set[str]]:
    """The `## Layers` table: layer -> the other layers it may import."""
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


def top_level_modules(root: Path) -> dict[str, list[Path]]:
    """Top-level name -> its .py files: each directory holding .py files (at any depth), each top-level .py file."""
    out: dict[str, list[Path]] = {}
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or p.name in ("results", "__pycache__"):
            continue
        if p.is_dir():
            files = sorted(f for f in p.rglob("*.py") if "__pycache__" not in f.parts)
            if files:
                out[p.name] = files
        elif p.suffix == ".py":
            out[p.stem] = [p]
    return out


def imported_top_levels(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, top-level name) of every import in a file; relative imports resolved from its package."""
    rel = path.relative_to(root)
    package = list(rel.parts[:-1])  # the package a relative import starts from
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.append((node.lineno, node.module.split(".")[0]))
                continue
            base = package[: len(package) - (node.level - 1)] if node.level - 1 <= len(package) else []
            if base:
                out.append((node.lineno, base[0]))
            elif node.module:
                out.append((node.lineno, node.module.split(".")[0]))
            else:
                out += [(node.lineno, a.name) for a in node.names]
    return out


def violations(root: Path, rules: dict[str, set[str]]) -> list[str]:
    modules = top_level_modules(root)
    problems = [f"{name}{'/' if modules[name][0].parent != root else '.py'}: holds .py files but is not a row of "
                f"the layer table" for name in modules if name not in rules and name not in NOT_LAYERS]
    project = set(modules) | set(rules)
    for layer in sorted(rules):
        allowed = rules[layer] | {layer}
        for path in modules.get(layer, []):
            for line, top in imported_top_levels(path, root):
                if top in project and top not in allowed:
                    may = ", ".join(sorted(rules[layer])) or "no other layer"
                    problems.append(f"{path.relative_to(root)}:{line}: imports {top} ({layer} may import: {may})")
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
    "tests/test_x.py": "import emu, workloads, schedulers, contracts, tasks\n",
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
        for path in sorted((REPO / layer).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    if n > 80:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
