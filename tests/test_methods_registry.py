"""Every method lives in one registry: no other list of method names in the code, and the CLI reads it."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from memorywalker.cli.main import app
from memorywalker.engine import METHODS, method_names, needs_full_view

SRC = Path(__file__).resolve().parents[1] / "src" / "memorywalker"


def test_registry_declares_every_method_once():
    assert list(METHODS) == ["per-call", "logit-tree", "radix", "tree-mask", "sdcc", "dfs", "rightmost"]
    assert method_names(reference=False) == [m for m in METHODS if m != "per-call"]
    assert [m for m in METHODS if METHODS[m].exact] == ["per-call", "logit-tree", "radix", "tree-mask"]
    assert needs_full_view(["dfs", "sdcc"]) and not needs_full_view(["radix", "dfs"])
    assert {m.schedule for m in METHODS.values()} == {"radix", "mask"}


def test_no_other_list_of_method_names_in_the_code():
    """No list/tuple/set/dict literal with two or more method names, and no string enumerating three or
    more ("a | b | c"), anywhere in src/ but the registry (engine/methods.py). Docstrings are docs."""
    names = set(METHODS)
    found = []
    for path in SRC.rglob("*.py"):
        if path == SRC / "engine" / "methods.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                hits = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
                if len(hits) >= 2:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {sorted(hits)}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                listed = {w for w in re.findall(r"[a-z][a-z-]+", node.value) if w in names}
                if len(listed) >= 3 and re.search(r"\|", node.value):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {sorted(listed)}")
    assert not found, found


def test_methods_command_prints_the_registry():
    res = CliRunner().invoke(app, ["methods", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["method"] for r in rows] == list(METHODS)
    assert {r["method"]: r["exact"] for r in rows}["radix"] == "exact"
