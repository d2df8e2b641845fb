"""What `pip install .` (the container images) ships: every Python package of the three trees."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_for_the_wheel() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    on_disk = set()
    for top, source in setuptools["package-dir"].items():
        for init in (ROOT / source).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / source)
            on_disk.add(".".join([top, *rel.parts]))
    assert on_disk == listed, f"pyproject packages: add {sorted(on_disk - listed)}, drop {sorted(listed - on_disk)}"
