"""Patch a module of vLLM's when it is imported, without importing it first.

vLLM loads general plugins in every process (API server, engine core, workers); importing the
module a plugin patches would load it where it is never used. The hook below runs the patch
right after the module has executed, wherever and whenever that happens.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

Patch = Callable[[ModuleType], object]


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the target modules through the other finders and patches them once executed."""

    def __init__(self) -> None:
        self.patches: dict[str, list[Patch]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patches = self.patches.get(fullname)
        if not patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: importlib.machinery.ModuleSpec | None = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module = _patching(spec.loader.exec_module, patches)  # type: ignore[method-assign,assignment]
                return spec
        return None


def _patching(exec_module: Callable[[ModuleType], None], patches: list[Patch]) -> Callable[[ModuleType], None]:
    def exec_and_patch(module: ModuleType) -> None:
        exec_module(module)
        for patch in patches:
            patch(module)

    return exec_and_patch


def on_import(name: str, patch: Patch) -> None:
    """Run ``patch(module)`` once ``name`` is imported, or now if it already is. Patches must
    be idempotent: a plugin's entry point may run more than once in a process."""
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    hook = next((f for f in sys.meta_path if isinstance(f, _PatchOnImport)), None)
    if hook is None:
        hook = _PatchOnImport()
        sys.meta_path.insert(0, hook)
    listed = hook.patches.setdefault(name, [])
    if patch not in listed:
        listed.append(patch)


def module_exists(name: str) -> bool:
    """Whether ``name`` (under an installed top-level package) has a source or compiled file,
    found without importing it or its parents: a plugin says at start that its target is missing
    from this vLLM instead of waiting, silent, for an import that never comes."""
    top, _, rest = name.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return False
    for root in spec.submodule_search_locations:
        base = Path(root, *rest.split(".")) if rest else Path(root)
        if (
            base.with_suffix(".py").is_file()
            or (base / "__init__.py").is_file()
            or any(base.parent.glob(f"{base.name}.*.so"))
        ):
            return True
    return False
