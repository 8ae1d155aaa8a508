"""The house as drawn from its imports: layers only import layers below them, no module import cycle
(function-local imports included), no file beyond ~400 lines, and no hand-typed list of registered
names outside the registries.

Imports are read from the source (``ast``), every ``import``/``from`` anywhere in a module, at module
level or inside functions. Two exceptions, neither executed by an import: code under
``if __name__ == "__main__":`` — a module's command-line entry point (``torchrun -m
memorywalker.recipes.sft``) hands itself to the CLI layer when run as a script — and imports under
``if TYPE_CHECKING:``, which only annotations read.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "memorywalker"

# Lower tiers first; a package may import its own modules and packages of lower tiers only
# (DESIGN.md's layers: records · render · tree · layout/attention · objectives · engine · train recipes ·
# rollout · importers · metrics/report · samplers · gateway · cli). Samplers (who writes a response) sit
# below rollout, which drives them, and the gateway, which serves them: they import records and render.
# The gateway sits below the recipes: the RL recipe runs real harness sessions through it.
TIERS = [
    {"fileio", "data", "errors"},
    {"records", "modelkit"},
    {"render"},
    {"samplers"},
    {"tree", "rollout"},
    {"layout", "attention", "objectives", "importers", "viewer", "export"},
    {"engine"},
    {"train", "metrics", "transforms", "bench"},
    {"eval"},
    {"gateway"},
    {"recipes"},
    {"integrations"},
    {"cli"},
    {"__main__"},  # python -m memorywalker: the CLI, for launchers that take a module (torchrun, accelerate)
]
TIER = {pkg: i for i, tier in enumerate(TIERS) for pkg in tier}

# Arrows the tiers would allow but the design forbids: the gateway serves real harnesses with a sampler
# and knows nothing of rollout's simulated harness, environments or expert.
FORBIDDEN = {"gateway": {"rollout"}}


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = p.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _is_skipped_guard(node: ast.AST) -> bool:
    """``if __name__ == "__main__":`` (a script's entry point) or ``if TYPE_CHECKING:`` (annotations only)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Every memorywalker module ``path`` imports (a ``from package import submodule`` counts the submodule)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    skip = {id(n) for guard in ast.walk(tree) if _is_skipped_guard(guard) for n in ast.walk(guard)}

    def resolve(dotted: str) -> str:
        while dotted not in modules and "." in dotted:
            dotted = dotted.rsplit(".", 1)[0]
        return dotted

    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.startswith("memorywalker")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.startswith("memorywalker"):
                found |= {resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in modules else resolve(base)
                          for a in node.names}
    return found - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_tier():
    packages = {_package(m) for m in _modules()} - {""}
    assert packages <= set(TIER), f"packages missing from TIERS: {sorted(packages - set(TIER))}"


def test_no_upward_import():
    """An import from a package to a package of the same or a higher tier is an upward arrow."""
    upward = [f"{a} -> {b}" for a, deps in _graph().items() for b in deps
              if _package(a) and _package(b) and _package(a) != _package(b)
              and TIER[_package(b)] >= TIER[_package(a)]]
    assert not upward, "upward or sideways imports:\n" + "\n".join(sorted(upward))


def test_no_forbidden_import():
    """The arrows of FORBIDDEN are absent, at module level or inside functions."""
    forbidden = [f"{a} -> {b}" for a, deps in _graph().items() for b in deps
                 if _package(b) in FORBIDDEN.get(_package(a), ())]
    assert not forbidden, "forbidden imports:\n" + "\n".join(sorted(forbidden))


def test_samplers_sit_below_rollout_and_the_gateway():
    """Samplers may import records and render, never rollout; both rollout and the gateway may import them."""
    assert TIER["samplers"] < TIER["rollout"] and TIER["samplers"] < TIER["gateway"]
    assert TIER["samplers"] > TIER["render"] > TIER["records"]
    assert "rollout" in FORBIDDEN["gateway"]
    graph = _graph()
    assert "memorywalker.samplers.base" in graph["memorywalker.rollout.episodes.harness"]  # the check is not vacuous


def test_no_import_cycle():
    """Tarjan's strongly connected components of the module graph: every one is a single module."""
    graph = _graph()
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = [0]

    def visit(v: str) -> None:  # iterative depth would be nicer; the graph is ~200 modules deep at most
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_sees_function_local_imports():
    """The check is not vacuous: a function-local import is an edge (recipes/demo.py imports the SFT recipe
    inside run_demo), and the __main__ entry points' CLI imports are the only ones left out."""
    graph = _graph()
    assert "memorywalker.recipes.sft" in graph["memorywalker.recipes.demo"]
    assert not any(d.startswith("memorywalker.cli") for d in graph["memorywalker.recipes.sft"])
    assert "memorywalker.cli.train_cmd" in (SRC / "recipes" / "sft.py").read_text()


def test_no_file_over_about_400_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 420}
    assert not long, f"files over ~400 lines: {long}"


REGISTRIES = {"engine/methods.py", "rollout/compressors.py", "importers/__init__.py", "objectives/normalize.py"}


def _mention(kind: str, name: str) -> str:
    """A name as code would type it: method, harness and importer names as words; normalization names
    are common words (``call``, ``token``), so only quoted."""
    return rf"[\"']{re.escape(name)}[\"']" if kind == "normalization" else rf"(?<![\w-]){re.escape(name)}(?![\w-])"


def test_no_hand_typed_lists_of_registered_names():
    """Harness, importer, method and normalization names are listed in code only in their registries: a
    second list drifts (help texts and error messages are generated from the registries). A list is three
    or more of one registry's names in one string literal or one bracketed literal on a line."""
    from memorywalker.engine import METHODS
    from memorywalker.importers import IMPORTERS
    from memorywalker.objectives.normalize import NORMALIZATIONS
    from memorywalker.rollout import COMPRESSORS

    registries = {"harness": list(COMPRESSORS), "importer": list(IMPORTERS), "method": list(METHODS),
                  "normalization": list(NORMALIZATIONS)}
    literal = re.compile(r"[\"'][^\"'\n]*[\"']|\([^()\n]*\)|\[[^\[\]\n]*\]")
    offenders = []
    for p in SRC.rglob("*.py"):
        if str(p.relative_to(SRC)) in REGISTRIES:
            continue
        text = p.read_text()
        for kind, names in registries.items():
            for m in literal.finditer(text):
                hits = sorted(n for n in names if re.search(_mention(kind, n), m.group()))
                if len(hits) >= 3:
                    offenders.append(f"{p.relative_to(SRC)}: {kind} names {hits} in {m.group()[:80]!r}")
    assert not offenders, "lists of registered names outside their registries:\n" + "\n".join(sorted(set(offenders)))
