"""Every example model optimized with ``--gemm-backends library`` and with
``--gemm-backends triton``, each bundle verified against onnxruntime.

    python -m examples.gemm_backends [NAME ...] [--work DIR]

Per model and backend: the worst relative error over the outputs and trials,
and the planned kernels by who runs them (library calls, generated Triton).
Exits 1 when any bundle does not verify (issue 13's done-when).  Tiny sizes,
exported by the TorchScript exporter at opset 17; in the interpreter tier.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from examples import EXAMPLES, export_example
from orchestrate import api
from orchestrate.kernels.spec import LIBRARY, VIEW

BACKENDS = (("library",), ("triton",))


@dataclass(frozen=True)
class Row:
    model: str
    backends: str
    ok: bool
    worst_rel: float
    library: int  # planned kernels that are library calls
    generated: int  # planned kernels that are generated Triton
    detail: str = ""


def check(name: str, work: Path) -> list[Row]:
    """``name`` exported once, optimized and verified once per backend."""
    model = work / f"{name}.onnx"
    export_example(name, model, dynamo=False, opset=17, size="tiny")
    rows = []
    for backends in BACKENDS:
        label = ",".join(backends)
        try:
            made = api.optimize(model, work / f"{name}-{label}", gemm_backends=backends)
        except Exception as e:  # noqa: BLE001 - one row per bundle, whatever went wrong
            rows.append(Row(name, label, False, float("nan"), 0, 0, f"{type(e).__name__}: {e}"))
            continue
        kernels = [k for k in made.plan.kernels if k.template != VIEW]
        library = sum(1 for k in kernels if k.template in LIBRARY)
        worst = max(c.rel for c in made.report.checks)
        rows.append(
            Row(
                name,
                label,
                made.report.ok and not made.report.simulated,
                worst,
                library,
                len(kernels) - library,
                made.report.simulated,
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        f"{'model':<16}{'backends':<10}{'worst rel. error':>18}{'library':>9}"
        f"{'generated':>11}  result"
    ]
    for r in rows:
        lines.append(
            f"{r.model:<16}{r.backends:<10}{r.worst_rel:>18.3g}{r.library:>9}"
            f"{r.generated:>11}  {'verified' if r.ok else 'FAILED ' + r.detail[:200]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.gemm_backends")
    p.add_argument("names", nargs="*", default=list(EXAMPLES), help="examples (default: all)")
    p.add_argument("--work", type=Path, default=None, help="folder for models and bundles")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in EXAMPLES]
    if unknown:
        p.error(f"unknown example {unknown[0]!r} (known: {', '.join(EXAMPLES)})")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = []
        for name in args.names:
            rows += check(name, work)
            for line in table(rows[-len(BACKENDS) :]).splitlines()[1:]:
                print(line, file=sys.stderr, flush=True)
    print(table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
