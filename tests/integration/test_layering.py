"""The package's dependencies point one way (checked on the import statements themselves,
function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import vllm_dartree

PACKAGE = Path(vllm_dartree.__file__).parent
PUBLIC_VLLM = {"vllm", "vllm.inputs"}  # what code outside integration/ may import from vLLM


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (``from a import b`` counts ``a`` and, when it
    is a module of ours, ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: {m for m in imports_of(path) if m in MODULES and m != name}
         for name, path in MODULES.items()}


def test_nothing_outside_testing_imports_it():
    offenders = {name: sorted(m for m in deps if m.startswith("vllm_dartree.testing"))
                 for name, deps in GRAPH.items() if not name.startswith("vllm_dartree.testing")}
    assert not {k: v for k, v in offenders.items() if v}


def test_there_are_no_import_cycles():
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(GRAPH[name]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [name, dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    # A package __init__ re-exporting its own modules is not a cycle of design.
    cycles = [c for c in cycles if not any(c[i + 1].startswith(c[i] + ".")
                                           for i in range(len(c) - 1))]
    assert not cycles


def test_the_tree_core_imports_no_vllm_and_nothing_above_it():
    for name, path in MODULES.items():
        if name.startswith("vllm_dartree.tree"):
            deps = imports_of(path)
            assert not {d for d in deps if d == "vllm" or d.startswith("vllm.")}, name
            ours = {d for d in deps if d.startswith("vllm_dartree.")}
            assert all(d.startswith(("vllm_dartree.tree", "vllm_dartree.kernels"))
                       for d in ours), (name, ours)


STEP_MAY_IMPORT = ("vllm_dartree.tree", "vllm_dartree.kernels", "vllm_dartree.config",
                   "vllm_dartree.checkpoint", "vllm_dartree.env", "vllm_dartree.step")


def is_under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_tree_step_imports_no_vllm_and_only_the_core_below_it():
    """``step/`` (one tree step, any runner) sits between ``tree/``/``kernels/`` and
    ``integration/``: no vLLM, of ours only the tree core, the settings and itself."""
    step_modules = {n: p for n, p in MODULES.items() if is_under(n, ("vllm_dartree.step",))}
    assert "vllm_dartree.step.tree_step" in step_modules
    for name, path in step_modules.items():
        relative = [n for n in ast.walk(ast.parse(path.read_text()))
                    if isinstance(n, ast.ImportFrom) and n.level]
        assert not relative, name  # the scan reads absolute imports only
        deps = imports_of(path)
        assert not {d for d in deps if is_under(d, ("vllm",))}, name
        ours = {d for d in deps if is_under(d, ("vllm_dartree",))}
        assert all(is_under(d, STEP_MAY_IMPORT) for d in ours), (name, ours)


def test_the_tree_core_never_reaches_the_step():
    for name, path in MODULES.items():
        if is_under(name, ("vllm_dartree.tree", "vllm_dartree.kernels")):
            assert not {d for d in imports_of(path) if is_under(d, ("vllm_dartree.step",))}, name


def test_vllm_internals_are_imported_only_by_the_integration_package():
    for name, path in MODULES.items():
        if name.startswith(("vllm_dartree.integration", "vllm_dartree.testing")):
            continue
        internal = {d for d in imports_of(path) if d.startswith("vllm.")
                    and d not in PUBLIC_VLLM and d.rsplit(".", 1)[0] not in PUBLIC_VLLM}
        assert not internal, (name, internal)


def test_the_graph_is_real():
    assert "vllm_dartree.tree" in GRAPH["vllm_dartree.step.drafting"]
    assert "vllm_dartree.step.verify_plan" in GRAPH["vllm_dartree.step.tree_step"]
    assert "vllm_dartree.kernels.topb" in GRAPH["vllm_dartree.tree.build"]


def test_each_runners_glue_stays_in_its_own_package():
    """V1 glue (integration/v1) and V2 glue (integration/v2) never import each other, and
    nothing else imports either, except activation (which installs them)."""
    for name, deps in GRAPH.items():
        for runner, other in (("v1", "v2"), ("v2", "v1")):
            if name.startswith(f"vllm_dartree.integration.{runner}"):
                assert not {d for d in deps if d.startswith(f"vllm_dartree.integration.{other}")}
        if not name.startswith(("vllm_dartree.integration.v1", "vllm_dartree.integration.v2",
                                "vllm_dartree.integration.activation", "vllm_dartree.testing")):
            glue = {d for d in deps if d.startswith(("vllm_dartree.integration.v1",
                                                      "vllm_dartree.integration.v2"))}
            assert not glue, (name, glue)
    assert "vllm_dartree.step.drafting" in GRAPH["vllm_dartree.integration.v2.speculator"]
