"""What the GPU machine lacks, installed from wheels beside what it has, never over it.

    python3 -m tools.bench_gpu.install [--wheels wheels] [--target out/site]

The GPU machine's python3 has torch, triton, onnx, onnxruntime (CPU),
click, pytest and matplotlib, but no network, no PuLP and no onnx2torch.
``make gpu-wheels`` downloads those two (pure Python) here; on the machine
only the ones missing there are installed, with ``pip install --no-index
--no-deps --target`` into a folder of their own: none of the machine's own
packages is replaced or shadowed (the folder holds nothing else), and this
project runs from its checkout.  The command prints the folder, for
``PYTHONPATH`` (``make test-gpu``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDED = ("pulp", "onnx2torch")  # import names, which are also the wheels' project names
WHEELS = ROOT / "wheels"
WHEELS_LIMIT_MB = 60  # of the 64 MiB that travel to the GPU machine


def normal(name: str) -> str:
    """A project name as wheels and imports may both spell it."""
    return name.lower().replace("-", "_")


def wheels_for(names, folder: Path) -> list[Path]:
    """The wheel of each of ``names`` in ``folder`` (SystemExit naming a missing one)."""
    found = {normal(w.name.split("-")[0]): w for w in sorted(folder.glob("*.whl"))}
    missing = [n for n in names if normal(n) not in found]
    if missing:
        raise SystemExit(
            f"bench-gpu: no wheel for {', '.join(missing)} in {folder} "
            "(make gpu-wheels, on a machine with the registry)"
        )
    return [found[normal(n)] for n in names]


def install(wheels: list[Path], target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--upgrade",
        "--target",
        str(target),
        *map(str, wheels),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(
            f"bench-gpu: pip could not install {', '.join(w.name for w in wheels)}: "
            f"{run.stderr.strip()[-300:]}"
        )


def ensure(folder: Path = WHEELS, target: Path = ROOT / "out/site") -> str:
    """Make PuLP and onnx2torch importable here and in child processes: the
    machine's own where it has them, else from ``folder``'s wheels into
    ``target`` (appended to ``sys.path`` and ``PYTHONPATH``)."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        return "PuLP and onnx2torch are installed: nothing to install"
    install(wheels_for(missing, folder), target)
    sys.path.append(str(target))
    importlib.invalidate_caches()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.environ.get("PYTHONPATH"), str(target)])
    )
    return f"installed {', '.join(missing)} from {folder} into {target} (nothing else there)"


def prove(folder: Path = WHEELS) -> dict:
    """The dry run's check of the offline install: the wheels installed into
    a fresh folder, which then holds only them, and imported from it in a
    child process outside the checkout."""
    wheels = wheels_for(NEEDED, folder)
    target = Path(tempfile.mkdtemp(prefix="bench-site-"))
    install(wheels, target)
    # onnx2torch imports torchvision, which this machine must not have: the
    # benchmark imports it as orchestrate.bench.torch_side does
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); sys.path.append(sys.argv[2])\n"
        "import pulp\n"
        "from orchestrate.bench.torch_side import import_onnx2torch\n"
        "onnx2torch = import_onnx2torch()\n"
        "for m in (pulp, onnx2torch): assert m.__file__.startswith(sys.argv[1]), m.__file__\n"
        "print('pulp', pulp.__version__, 'and onnx2torch imported from', sys.argv[1])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(target), str(ROOT)],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith((".dist-info", "bin")))
    shutil.rmtree(target, ignore_errors=True)
    mb = sum(w.stat().st_size for w in folder.glob("*.whl")) / 2**20
    return {
        "ok": r.returncode == 0,
        "wheels": [w.name for w in wheels],
        "wheels_mb": round(mb, 1),
        "installed": top,
        "import": (r.stdout if r.returncode == 0 else r.stderr).strip()[-300:],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m tools.bench_gpu.install", description=__doc__.split("\n")[0]
    )
    p.add_argument("--wheels", type=Path, default=WHEELS)
    p.add_argument("--target", type=Path, default=ROOT / "out/site")
    p.add_argument(
        "--check",
        action="store_true",
        help="only check the wheel folder: the wheels needed there, within the limit",
    )
    args = p.parse_args(argv)
    if args.check:
        wheels = wheels_for(NEEDED, args.wheels)
        mb = sum(w.stat().st_size for w in args.wheels.glob("*.whl")) / 2**20
        for w in wheels:
            print(f"  {w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
        print(f"{args.wheels}: {mb:.1f} MiB (limit {WHEELS_LIMIT_MB} MiB)")
        return 0 if mb <= WHEELS_LIMIT_MB else 1
    print(ensure(args.wheels, args.target), file=sys.stderr)
    print(args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
