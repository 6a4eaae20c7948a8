"""`make bench-gpu`: the benchmark suite, optimized, verified and timed against every baseline.

    python -m examples.bench_gpu [--dry-run] [--budget S] [--only NAME ...]
                                 [--dtypes fp16 bf16] [--fp32 NAME ...] [--wheels DIR]

One prepared run for one NVIDIA GPU, within ``--budget`` seconds (540: nine
minutes on the reference H200):

1. what the machine lacks (PuLP, onnx2torch, this project when run from
   elsewhere) is installed from ``--wheels`` (``make gpu-wheels``) with
   ``pip install --no-index --no-deps --target``: no venv, no network;
2. the suite (``examples/suite.py``, full size) is written to out/models;
3. each model, in a child process with what is left of the budget shared
   among the models still to run: optimized at fp16 and bf16 (and fp32 for
   ``--fp32``), verified on one random trial, and timed with
   ``orchestrate.bench`` against torch eager, torch.compile (default and
   max-autotune) and onnxruntime's CUDA provider.  Planning is tuned
   (``optimize --tune``: each candidate's best ``--tune-configs`` configurations
   under the cost model timed on the GPU, cached in the user's measurement
   cache, so a second run times nothing); ``--no-tune`` plans by the model
   alone.  What the budget does not reach is skipped with the reason, never
   overrun;
4. ``bench/results/<device>-<date>.json`` (``orchestrate.bench.report``'s
   schema, each entry with its ``tuning``) and its PNG, and
   ``bench/records/<device>.jsonl``: every measurement of this GPU in the
   cache, as ``orchestrate records export`` writes them.

``--dry-run`` is the same script on a CPU (``make bench-gpu-dry``): the
tiny suite, the Triton interpreter, fewer timed calls, every baseline that
can run on a CPU (onnxruntime's CPU provider too), the offline install
proven into a temporary folder and imported from a child process, and the
files written to out/bench-dry/ (results.json, chart.png).  There is no GPU
to time kernels on, so the tuning and records path runs with a fake timer
(the cost model's time x a factor drawn from each spec's hash), its cache in
the run's work folder, never the user's: the entries' ``tuning`` and every
line of out/bench-dry/records/fake.jsonl say ``fake``, and none of it is a
measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("pulp", "onnx2torch", "orchestrate")  # what the reference GPU machine lacks
WHEELS_LIMIT_MB = 60
FP32_DEFAULT = ("bert", "resnet50", "llama")
# the dry run proves each path once rather than timing everything: fp16 for
# every model, bf16 and fp32 for one each, torch.compile (25-30 s a process
# on 2 cores) for one model through the torch source and one through onnx2torch
DRY_BF16, DRY_FP32, DRY_COMPILE = ("bert",), ("resnet50",), ("bert", "resnet50")
TRANSFORMER_TYPES = {"bert": "bert", "gpt2": "gpt2", "vit": "vit"}  # onnxruntime model_type


# -- offline install ---------------------------------------------------------------------------


def wheels_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.glob("*.whl")) / 2**20


def install_wheels(wheels: Path, target: Path) -> str:
    """Every wheel in ``wheels`` into ``target`` (pip, no index, no deps);
    a wheel this Python cannot take is skipped and named."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
           "--target", str(target)]  # fmt: skip
    every = sorted(wheels.glob("*.whl"))
    skipped = []
    if subprocess.run(pip + [str(w) for w in every], capture_output=True).returncode != 0:
        for w in every:  # one this Python cannot take stops the lot: each on its own
            if subprocess.run(pip + [str(w)], capture_output=True).returncode != 0:
                skipped.append(w.name)
    return f"installed {wheels}/*.whl into {target}" + (
        f" (skipped, not for this Python: {', '.join(skipped)})" if skipped else ""
    )


def bootstrap(wheels: Path, target: Path) -> str:
    """Make PuLP, onnx2torch and orchestrate importable: from the environment
    if there, else from the wheels (appended to sys.path, so the checkout's
    own orchestrate, when run from it, comes first)."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        return "every package needed is installed"
    if not any(wheels.glob("*.whl")):
        raise SystemExit(f"bench-gpu: {', '.join(missing)} missing and no wheels in {wheels} "
                         "(make gpu-wheels, on a machine with the registry)")  # fmt: skip
    message = install_wheels(wheels, target)
    sys.path.append(str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"),
                                                             str(target)]))  # fmt: skip
    return f"{', '.join(missing)} missing: {message}"


def prove_offline_install(wheels: Path, out: Path) -> dict:
    """Install the wheels into a fresh folder and import the runtime from it
    in a child process outside the checkout, PuLP-free import checked."""
    target = Path(tempfile.mkdtemp(prefix="bench-site-", dir=out))
    message = install_wheels(wheels, target)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import orchestrate, pulp\n"
        "from orchestrate.bench.torch_side import import_onnx2torch\n"
        "onnx2torch = import_onnx2torch()\n"
        "assert onnx2torch.__file__.startswith(sys.argv[1]), onnx2torch.__file__\n"
        "assert orchestrate.__file__.startswith(sys.argv[1]), orchestrate.__file__\n"
        "print(orchestrate.__version__, pulp.__version__)\n"
    )
    r = subprocess.run([sys.executable, "-c", script, str(target)], cwd=tempfile.gettempdir(),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    ok = r.returncode == 0
    return {"ok": ok, "wheels_mb": round(wheels_mb(wheels), 1), "message": message,
            "import": (r.stdout.strip() if ok else r.stderr.strip()[-300:])}  # fmt: skip


# -- one model, in a child process ---------------------------------------------------------------


def run_model(args) -> int:
    """Optimize and bench one model at each dtype; one JSON line per dtype to
    ``args.part`` as soon as it is done (a timeout loses only the one running)."""
    from orchestrate import api
    from orchestrate.bench import report
    from orchestrate.bench.run import Settings, bench_model
    from orchestrate.bench.torch_side import Unconvertible, from_onnx

    src = Path(args.model_path)
    name = args.one
    tune = _tune(args)
    settings = Settings(args.runs, args.warmup, args.sets, deadline=args.deadline - 3)
    for dtype in args.dtypes:
        left = args.deadline - time.time()
        if left < 5:
            _emit(args.part, {"skip": {"name": name, "dtype": dtype,
                                       "reason": "not run: the model's share of the budget was spent"}})  # fmt: skip
            continue
        out = Path(args.work) / f"{name}-{dtype}.orch"
        started = time.perf_counter()
        try:
            made = api.optimize(src, out, dtype=dtype, trials=1, time_limit=20, tune=tune)
        except Exception as e:  # noqa: BLE001 - a failure is this entry's reason
            _emit(args.part, {"skip": {"name": name, "dtype": dtype,
                                       "reason": f"optimize failed: {type(e).__name__}: {e}"[:300]}})  # fmt: skip
            continue
        optimize_s = time.perf_counter() - started
        rep = made.report
        verified = None if rep is None or rep.simulated else rep.ok
        note = (f"simulated in numpy, not run: {rep.simulated}" if rep is not None and rep.simulated
                else "1 random trial against onnxruntime (CPU)")  # fmt: skip
        bundle, model, graph = api.bundle_and_model(out, src)

        def torch_module(model=model):
            if args.torch_from == "onnx":
                try:
                    return from_onnx(model)
                except Unconvertible as e:
                    why = str(e)
            else:
                why = "chosen"
            from examples import build_model

            size = src.stem.split("_", 1)[0]
            return build_model(name, size)[
                0
            ], f"torch source (examples {name} {size}; onnx2torch: {why})"

        result = bench_model(name, bundle, model, graph, args.against, settings, optimize_s=optimize_s,
                             verified=verified, verify_note=note, torch_module=torch_module,
                             model_type=_ort_type(name, src))  # fmt: skip
        rec = report.model_record(result)
        tuning = made.plan.tuning  # None under --no-tune
        rec["tuning"] = dataclasses.asdict(tuning) if tuning is not None else None
        _emit(args.part, {"model": rec})
        for line in report.table(result, bool(bundle.interpret)):
            print("  " + line, flush=True)
    return 0


def _tune(args):
    """The Tune of a child: the GPU's timer and the user's cache, a fake
    timer and the run's own cache (the dry run), or none (--no-tune)."""
    if args.tune_mode == "off":
        return None
    from orchestrate.tune import Tune

    if args.tune_mode == "gpu":
        from orchestrate.tune.gpu import GpuTimer

        return Tune(GpuTimer(), args.tune_configs)
    return Tune(fake_timer(), args.tune_configs, Path(args.tune_cache))


def fake_timer():
    """The dry run's stand-in: the cost model's time (for the device
    planned for) x a factor in [0.5, 2) drawn from the spec's hash, so that
    tuning moves some choices; labelled fake everywhere it goes."""
    from orchestrate.cost.roofline import cost
    from orchestrate.devices import get_device
    from orchestrate.tune import FakeTimer

    device = get_device(None)

    def figure(graph, spec):
        return cost(graph, spec, device).time_us * 2 ** (int(spec.hash[:4], 16) / 65536 * 2 - 1)

    return FakeTimer(figure, device=f"fake ({device.name} cost model x hash factor)")


def _ort_type(name: str, src: Path) -> tuple[str, int, int] | None:
    """(onnxruntime.transformers model_type, heads, hidden) for its fusions."""
    if name not in TRANSFORMER_TYPES:
        return None
    from examples import EXAMPLES

    config = EXAMPLES[name].config(src.stem.split("_", 1)[0])
    return TRANSFORMER_TYPES[name], getattr(config, "heads", 0), getattr(config, "hidden", 0)


def _emit(path: str, obj: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


# -- the whole run -----------------------------------------------------------------------------


def device_name(dry: bool) -> str:
    if dry:
        return "CPU (Triton interpreter)"
    import torch

    return torch.cuda.get_device_name(0)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m examples.bench_gpu", description=__doc__.split("\n")[0]
    )
    p.add_argument("--dry-run", action="store_true", help="the tiny suite on this CPU")
    p.add_argument("--budget", type=float, default=None, help="seconds in all (540; dry 420)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="models of the suite to run")
    p.add_argument("--dtypes", nargs="+", default=None, help="fp16 bf16 (dry run: fp16, and bf16 "
                   f"for {', '.join(DRY_BF16)})")  # fmt: skip
    p.add_argument("--fp32", nargs="*", default=None, metavar="NAME",
                   help=f"models also run at fp32 (default {' '.join(FP32_DEFAULT)}; "
                        f"dry run: {' '.join(DRY_FP32)})")  # fmt: skip
    p.add_argument("--wheels", type=Path, default=ROOT / "wheels")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--onnx2torch", nargs="*", default=None, metavar="NAME",
                   help="models whose torch baselines run onnx2torch's conversion of the ONNX "
                        "model, not the examples' torch source (default: none; dry run: "
                        "resnet50, to prove that path)")  # fmt: skip
    # the child's arguments (one model)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--model-path", help=argparse.SUPPRESS)
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--against", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--sets", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--torch-from", choices=("source", "onnx"), help=argparse.SUPPRESS)
    p.add_argument("--no-tune", action="store_true",
                   help="plan by the cost model alone (no --tune, no records)")  # fmt: skip
    p.add_argument("--tune-configs", type=int, default=3,
                   help="configurations timed per kernel (optimize --tune-configs)")  # fmt: skip
    p.add_argument("--tune-mode", choices=("gpu", "fake", "off"), help=argparse.SUPPRESS)
    p.add_argument("--tune-cache", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        return run_model(args)
    started = time.time()
    dry = args.dry_run
    budget = args.budget or (420.0 if dry else 540.0)
    out = args.out or (ROOT / "out/bench-dry" if dry else ROOT / "bench/results")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-work-", dir=ROOT / "out" if dry else None))
    print("bench-gpu: " + bootstrap(args.wheels, ROOT / "out/bench-site"), flush=True)
    from orchestrate.bench import clock, report
    from orchestrate.bench.runtimes import (
        DEFAULT_CPU,
        DEFAULT_GPU,
        TORCH_COMPILE,
        TORCH_MAX_AUTOTUNE,
    )

    if not dry and not clock.cuda():
        print("bench-gpu: no CUDA GPU here (make bench-gpu-dry runs the same script on a CPU)",
              file=sys.stderr)  # fmt: skip
        return 2
    install = prove_offline_install(args.wheels, work) if dry else None
    if install is not None:
        print(f"bench-gpu: offline install {'ok' if install['ok'] else 'FAILED'}: "
              f"{install['message']}; import: {install['import']}", flush=True)  # fmt: skip
    # 2. the suite
    from examples.suite import SUITE

    models_dir = (out / "models") if dry else ROOT / "out/models"
    names = [n for n, _ in SUITE if not args.only or n in args.only]
    paths = {n: models_dir / f"{'tiny' if dry else size}_{n}.onnx" for n, size in SUITE}
    todo = [n for n in names if not paths[n].exists()]
    if todo:
        cmd = [sys.executable, "-m", "examples.suite", "--out", str(models_dir), "--only", *todo]
        subprocess.run(cmd + (["--tiny"] if dry else []), cwd=ROOT, check=True)
    print(f"bench-gpu: suite ready in {time.time() - started:.0f} s", flush=True)
    # 3. each model in a child, with its share of what is left
    fp32 = args.fp32 if args.fp32 is not None else list(DRY_FP32 if dry else FP32_DEFAULT)

    def plan_for(name: str) -> tuple[list[str], tuple[str, ...]]:
        """The dtypes and runtimes one model is run with."""
        if args.dtypes:
            dtypes = list(args.dtypes)
        else:
            dtypes = ["fp16", "bf16"] if not dry or name in DRY_BF16 else ["fp16"]
        if not dry or name in DRY_COMPILE:
            return dtypes + (["fp32"] if name in fp32 else []), DEFAULT_CPU if dry else DEFAULT_GPU
        quick = tuple(r for r in DEFAULT_CPU if r not in (TORCH_COMPILE, TORCH_MAX_AUTOTUNE))
        return dtypes + (["fp32"] if name in fp32 else []), quick

    onnx2torch = args.onnx2torch if args.onnx2torch is not None else (["resnet50"] if dry else [])
    part = work / "results.jsonl"
    tune_mode = "off" if args.no_tune else "fake" if dry else "gpu"
    fake_cache = work / "fake-measurements.sqlite"  # the dry run's: never the user's cache
    skipped = []
    for i, name in enumerate(names):
        dtypes, against = plan_for(name)
        left = started + budget - time.time()
        share = left / (len(names) - i)
        if share < 10:
            skipped += [{"name": name, "dtype": d, "reason": "not run: the budget was spent"}
                        for d in dtypes]  # fmt: skip
            continue
        deadline = time.time() + share
        cmd = [sys.executable, "-m", "examples.bench_gpu", "--one", name, "--model-path",
               str(paths[name]), "--part", str(part), "--work", str(work), "--deadline",
               str(deadline), "--dtypes", *dtypes, "--against", *against,
               "--runs", str(args.runs or (5 if dry else 50)),
               "--warmup", str(args.warmup or (1 if dry else 10)),
               "--sets", str(args.sets or (2 if dry else 4)),
               "--torch-from", "onnx" if name in onnx2torch else "source",
               "--tune-mode", tune_mode, "--tune-configs", str(args.tune_configs),
               "--tune-cache", str(fake_cache)]  # fmt: skip
        print(f"bench-gpu: {name} {' '.join(dtypes)} within {share:.0f} s", flush=True)
        before = _lines(part)
        try:
            subprocess.run(cmd, cwd=ROOT, timeout=share + 15)
        except subprocess.TimeoutExpired:
            pass
        done = {(json.loads(x).get("model") or json.loads(x).get("skip"))["dtype"]
                for x in _lines(part)[len(before):]}  # fmt: skip
        skipped += [{"name": name, "dtype": d, "reason": f"not finished within its {share:.0f} s"}
                    for d in dtypes if d not in done]  # fmt: skip
    # 4. the files
    entries = [json.loads(x) for x in _lines(part)]
    records = [e["model"] for e in entries if "model" in e]
    for rec in records:
        for key in set(DEFAULT_CPU if dry else DEFAULT_GPU) - set(plan_for(rec["name"])[1]):
            rec["unavailable"].setdefault(key, "not run in the dry run: it proves torch.compile "
                                               f"on {' and '.join(DRY_COMPILE)} only")  # fmt: skip
    skipped = [e["skip"] for e in entries if "skip" in e] + skipped
    device = device_name(dry)
    doc = report.document(records, device=device, clock=clock.clock_name(not dry),
                          interpreter=dry, skipped=skipped)  # fmt: skip
    doc["budget_s"] = budget
    doc["wall_s"] = round(time.time() - started, 1)
    if install is not None:
        doc["offline_install"] = install
    problems = report.check_document(doc)
    stem = "results" if dry else f"{slug(device)}-{doc['date']}"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"bench-gpu: wrote {out / f'{stem}.json'} ({len(records)} measured, {len(skipped)} "
          f"skipped, {doc['wall_s']} s)")  # fmt: skip
    print("bench-gpu: " + report.chart(doc, out / ("chart.png" if dry else f"{stem}.png")))
    if tune_mode != "off":
        print("bench-gpu: " + write_records(dry, device, out, fake_cache), flush=True)
    for line in problems:
        print(f"bench-gpu: schema: {line}", file=sys.stderr)
    ok = not problems and (install is None or install["ok"]) and bool(records)
    return 0 if ok else 1


def write_records(dry: bool, device: str, out: Path, fake_cache: Path) -> str:
    """Every measurement of this GPU in the user's cache to
    bench/records/<device>.jsonl (the dry run: its fake cache to
    out/bench-dry/records/fake.jsonl); what was written, or why not."""
    from orchestrate.errors import OrchestrateError
    from orchestrate.tune.export import export

    folder = (out if dry else ROOT / "bench") / "records"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ("fake.jsonl" if dry else f"{slug(device)}.jsonl")
    try:
        n = export(path, None if dry else device, fake_cache if dry else None)
    except OrchestrateError as e:
        return f"no records written: {e}"
    return f"wrote {path}: {n} records" + (" (FAKE timer: not measurements)" if dry else "")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


if __name__ == "__main__":
    sys.exit(main())
