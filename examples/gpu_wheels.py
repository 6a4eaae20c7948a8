"""Check the wheel folder `make gpu-wheels` filled: what it holds, and that it fits.

    python -m examples.gpu_wheels [DIR]

The GPU machine takes 64 MiB in all; the wheels get 60 of it.  Exit 1 when
the folder is over that, or lacks a wheel ``make bench-gpu`` needs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from examples.bench_gpu import NEEDED, WHEELS_LIMIT_MB, wheels_mb


def main(argv: list[str] | None = None) -> int:
    folder = Path((argv or sys.argv[1:] or ["wheels"])[0])
    wheels = sorted(folder.glob("*.whl"))
    for w in wheels:
        print(f"  {w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
    total = wheels_mb(folder)
    have = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    missing = [n for n in NEEDED if n.lower() not in have]
    print(f"{folder}: {len(wheels)} wheels, {total:.1f} MiB (limit {WHEELS_LIMIT_MB} MiB)")
    if missing:
        print(f"{folder}: missing {', '.join(missing)}", file=sys.stderr)
    if total > WHEELS_LIMIT_MB:
        print(f"{folder}: over the limit by {total - WHEELS_LIMIT_MB:.1f} MiB", file=sys.stderr)
    return 1 if missing or total > WHEELS_LIMIT_MB else 0


if __name__ == "__main__":
    sys.exit(main())
