"""Every vLLM name the plugin relies on exists, with the parameters it relies on, in the
Python sources of every supported vLLM release (read as text, never imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vllm_dartree
from vllm_dartree.integration.patching import SUPPORTED_VLLM
from vllm_dartree.integration.touchpoints import CHECKED_RELEASES, GLUE_RELEASES, NAMES
from vllm_dartree.testing.vllm_sources import SourceTree, release_source_root

PACKAGE = Path(vllm_dartree.__file__).parent
RELEASES = {release.version: release for release in CHECKED_RELEASES}


@pytest.fixture(scope="module", params=sorted(RELEASES))
def source_tree(request) -> tuple[str, SourceTree]:
    return request.param, SourceTree(release_source_root(RELEASES[request.param]))


def test_the_version_gate_accepts_exactly_the_checked_releases():
    checked = {tuple(int(p) for p in r.version.split(".")[:2]) for r in CHECKED_RELEASES}
    assert set(SUPPORTED_VLLM) == checked


def problems(tree: SourceTree, path: str, params=(), exact=False) -> str | None:
    found = tree.resolve(path)
    if found is None:
        return f"{path}: not found"
    if exact and found.params != tuple(params):
        return f"{path}: signature {found.params}, the plugin relies on {tuple(params)}"
    missing = [p for p in params if p not in found.params]
    if missing and not found.open_ended:
        return f"{path}: no parameter {missing} (has {found.params})"
    return None


def test_every_declared_name_resolves(source_tree):
    version, tree = source_tree
    failures = [p for n in NAMES if version in n.releases
                and (p := problems(tree, n.path, n.params, n.exact))]
    assert not failures, f"vLLM {version}:\n" + "\n".join(failures)


def glue_releases(relative: str) -> tuple[str, ...] | None:
    """The releases a product file's vLLM imports must resolve in (None: every release)."""
    for prefix, releases in GLUE_RELEASES.items():
        if relative.startswith(prefix):
            return releases
    return None


def product_vllm_imports(version: str | None = None) -> dict[str, list[str]]:
    """``module:name`` of every vLLM import in the product (not its test helpers), with the
    files that import it; ``import vllm.x as m`` counts each ``m.attr`` it reads. With
    ``version``, only files whose glue runs on that release (``GLUE_RELEASES``)."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if "testing" in relative.parts:
            continue
        releases = glue_releases(relative.as_posix())
        if version is not None and releases is not None and version not in releases:
            continue
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == "vllm" or node.module.startswith("vllm.")):
                for alias in node.names:
                    found.setdefault(f"{node.module}:{alias.name}", []).append(path.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "vllm" or alias.name.startswith("vllm."):
                        aliases[alias.asname or alias.name] = alias.name
                        found.setdefault(alias.name, []).append(path.name)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                    and isinstance(node.value, ast.Name) and not node.attr.startswith("__")
                    and node.value.id in aliases and aliases[node.value.id] != "vllm"):
                found.setdefault(f"{aliases[node.value.id]}:{node.attr}", []).append(path.name)
    return found


def is_declared(name: str, tree: SourceTree, version: str) -> bool:
    """Declared (for ``version``) itself, or a declared name lives inside it."""
    module, _, qualname = name.partition(":")
    if qualname and tree.module_file(f"{module}.{qualname}"):  # `from vllm.x import module`
        module, qualname = f"{module}.{qualname}", ""
    if not qualname:
        return any(version in n.releases and (n.path == module or n.path.startswith(module + ":"))
                   for n in NAMES)
    name = f"{module}:{qualname}"
    return any(version in n.releases and (n.path == name or n.path.startswith(name + "."))
               for n in NAMES)


def declared_elsewhere_only(name: str, version: str) -> bool:
    entries = [n for n in NAMES if n.path == name]
    return bool(entries) and not any(version in n.releases for n in entries)


def test_every_vllm_import_of_the_product_resolves_and_is_declared(source_tree):
    version, tree = source_tree
    failures = []
    for name, files in product_vllm_imports(version).items():
        if declared_elsewhere_only(name, version):
            continue  # a release-specific import the product guards (e.g. 0.34's _cpu_ops)
        if ":" not in name:  # a plain `import vllm.x`: the module must exist
            problem = None if tree.module_file(name) else f"{name}: no such module"
        else:
            problem = problems(tree, name)
        if problem is None and not is_declared(name, tree, version):
            problem = f"{name}: used but not declared in integration/touchpoints.py"
        if problem:
            failures.append(f"{problem} (imported in {', '.join(sorted(set(files)))})")
    assert not failures, f"vLLM {version}:\n" + "\n".join(failures)


def test_the_scan_sees_imports():
    """The scan finds the plugin's real imports (so an empty scan cannot pass)."""
    imports = product_vllm_imports()
    assert "vllm.v1.spec_decode.dflash:DFlashProposer" in imports
    assert len(imports) > 20


def test_a_missing_name_is_reported(source_tree):
    _, tree = source_tree
    assert problems(tree, "vllm.v1.worker.gpu_model_runner:GPUModelRunner.no_such_method")
    assert problems(tree, "vllm.engine.arg_utils:EngineArgs.create_speculative_config",
                    ("self", "target_model_config"), exact=True)
