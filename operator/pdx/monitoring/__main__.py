"""python -m pdx.monitoring [--write | --check]: the chart's rules file and dashboard."""

from __future__ import annotations

import sys

from pdx.monitoring import files


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for path in files.write():
            print(f"wrote {path.relative_to(files.ROOT)}")
        return 0
    if argv == ["--check"]:
        stale = files.stale()
        for path in stale:
            print(f"stale: {path.relative_to(files.ROOT)} (run python -m pdx.monitoring --write)", file=sys.stderr)
        return 1 if stale else 0
    print("usage: python -m pdx.monitoring --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
