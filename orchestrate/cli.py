"""The `orchestrate` command line.  Thin: parse, call orchestrate.*, print.

Every error a user can cause is an OrchestrateError: it is printed as one
line naming the file, node or option, and the exit code is 2.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

import click
import numpy as np

from orchestrate.errors import InputError, OrchestrateError
from orchestrate.text import shown

EXIT_USER_ERROR = 2
EXIT_MISMATCH = 1  # verify: the bundle does not compute what the model computes
EXIT_INTERNAL_ERROR = 3


def echo(message: str = "", **kw) -> None:
    """``click.echo`` with each line through ``text.shown``: what the
    commands print holds names from the model."""
    click.echo("\n".join(map(shown, str(message).split("\n"))), **kw)


def _fail(message: str, code: int, *, at_once: bool = False) -> None:
    """The one error line, then exit ``code``.  ``at_once`` (after a signal,
    the cleanup done): end the process without the interpreter's teardown.
    The exception the signal raised may have landed inside an extension
    module (torch, Triton, numpy mid-call or mid-import), and tearing such a
    module down is where a process then crashes (streams flushed first)."""
    echo(f"orchestrate: error: {shown(message)}", err=True)
    if at_once:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


class _Group(click.Group):
    """Click's own usage errors (a bad option value, a missing argument) as
    one line and exit 2, like every other error a user can cause."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            hint = f" (see {e.ctx.command_path} --help)" if e.ctx is not None else ""
            _fail(e.format_message() + hint, EXIT_USER_ERROR)
        except click.ClickException as e:
            _fail(e.format_message(), EXIT_USER_ERROR)
        except click.Abort:
            _fail("interrupted", 130)
        sys.exit(rv if isinstance(rv, int) else 0)


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised wherever the program is (as Python
    raises KeyboardInterrupt for SIGINT), so that the code which removes
    temporary files runs on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_RESEND_S = 0.25


class _Signals:
    """Turns those signals into Interrupted while a command runs.

    An exception raised at an arbitrary point can be lost: an extension module
    being imported turns it into ImportError, which its importer may catch,
    and one raised in a ``__del__`` is only printed.  So the first signal is
    remembered, whatever exception then ends the command reports it, and until
    the command has ended the signal is sent again every ``_RESEND_S``."""

    def __init__(self):
        self.received: int | None = None
        self.done = threading.Event()
        self.old: dict = {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._raise) for s in _SIGNALS}

    def _raise(self, signum, frame):
        if self.received is None:
            self.received = signum
            threading.Thread(target=self._again, args=(signum,), daemon=True).start()
        raise Interrupted(self.received)

    def _again(self, signum: int) -> None:
        while not self.done.wait(_RESEND_S):
            os.kill(os.getpid(), signum)

    def uninstall(self) -> None:
        """Put the old handlers back; after a signal, ignore any more (the
        process is on its way out)."""
        for s, h in self.old.items():
            signal.signal(s, signal.SIG_IGN if self.received is not None else h)
        self.old = {}
        self.done.set()


def reports_errors(fn):
    """Turn OrchestrateError into one line and exit code 2; never a traceback.
    SIGINT, SIGTERM and SIGHUP clean up and exit with 128 + the signal number."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        signals = _Signals()
        try:
            return fn(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as e:
            signals.uninstall()
            if signals.received is not None or isinstance(e, KeyboardInterrupt):
                signum = signals.received or getattr(e, "signum", signal.SIGINT)
                _fail(
                    f"interrupted by {signal.Signals(signum).name}",
                    128 + signum,
                    at_once=signals.received is not None,
                )
            if isinstance(e, OrchestrateError):
                _fail(str(e), EXIT_USER_ERROR)
            if isinstance(e, BrokenPipeError):  # `orchestrate rules | head`: the reader left
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(128 + signal.SIGPIPE)
            # anything else is a bug: say so in one line
            if click.get_current_context().find_root().params.get("debug"):
                traceback.print_exc()
            _fail(
                f"internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)",
                EXIT_INTERNAL_ERROR,
            )
        finally:
            signals.uninstall()

    return wrapper


def shape_option(fn):
    return click.option(
        "--shape",
        "shapes",
        metavar="NAME=DIMS",
        multiple=True,
        help="Bind a dynamic input shape, e.g. --shape input_ids=1x128, or give a range: "
        "--shape input_ids=1..8x2..64@32 (MIN..MAX@OPT per dimension; OPT defaults to MAX) "
        "for one bundle serving every shape in it (repeatable).",
    )(fn)


def dim_option(fn):
    return click.option(
        "--dim",
        "dims",
        metavar="SYMBOL=MIN..MAX[@OPT]",
        multiple=True,
        help="A range for a symbolic dimension of the model wherever it appears, e.g. "
        "--dim batch=1..8 --dim sequence=2..64@32 (repeatable).",
    )(fn)


def const_option(fn):
    return click.option(
        "--const",
        "consts",
        metavar="NAME=VALUE",
        multiple=True,
        help="Bind an input to a value, e.g. --const sample_rate=16000 (a list for a "
        "1-D input: --const ids=3,1,2): it becomes a constant of the model, an If on it "
        "takes its branch, and the bundle no longer has the input (repeatable).",
    )(fn)


def draw_options(fn):
    fn = click.option(
        "--input-range",
        "input_ranges",
        metavar="NAME=LO..HI",
        multiple=True,
        help="Draw this input's verification values from LO..HI (floats uniform in "
        "[LO, HI), integers LO to HI) instead of what the graph needs (repeatable).",
    )(fn)
    return click.option(
        "--input",
        "input_files",
        metavar="NAME=FILE.npy",
        multiple=True,
        help="Verify with this array for the input, in every trial (static shapes; repeatable).",
    )(fn)


def _draw_args(ranges, files) -> dict:
    """--input-range and --input as the API's input_ranges and inputs."""
    from orchestrate.check.draws import parse_range
    from orchestrate.files import iofiles

    out: dict = {}
    if ranges:
        parsed: dict = {}
        for text in ranges:
            name, bounds = parse_range(text)
            if parsed.setdefault(name, bounds) != bounds:
                raise InputError(f"--input-range {name}: given twice with different ranges")
        out["input_ranges"] = parsed
    if files:
        out["inputs"] = iofiles.read_inputs(_parse_inputs(files))
    return out


def _consts(texts) -> dict[str, list[str]]:
    """--const options as {NAME: value texts}; the values are read in the
    input's dtype when the model is loaded."""
    from orchestrate.frontend.constants import parse_const

    out: dict[str, list[str]] = {}
    for text in texts:
        name, values = parse_const(text)
        if out.setdefault(name, values) != values:
            raise InputError(f"--const {name}: given twice with different values")
    return out


def _ranges(texts, dims):
    """--shape and --dim as (input -> per-axis DimRanges, symbol -> DimRange)
    when any gives a range, else None (a static shape: ``_shapes``)."""
    from orchestrate.errors import InputError
    from orchestrate.shapes.dims import is_range_text, parse_dim, parse_range_shape

    if not dims and not any(map(is_range_text, texts)):
        return None
    given: dict = {}
    for text in texts:
        name, ranges = parse_range_shape(text)
        if given.setdefault(name, ranges) != ranges:
            raise InputError(f"--shape {name}: given twice with different dimensions")
    symbols: dict = {}
    for text in dims:
        name, r = parse_dim(text)
        if symbols.setdefault(name, r) != r:
            raise InputError(f"--dim {name}: given twice with different ranges")
    return given, symbols


def _shapes(texts) -> dict[str, tuple[int, ...]]:
    """--shape options as {NAME: dims}; parsed here, not by click, so that a
    bad one is a one-line error like any other."""
    from orchestrate.errors import InputError
    from orchestrate.frontend import parse_shape
    from orchestrate.shapes.dims import is_range_text

    for text in texts:
        if is_range_text(text):
            raise InputError(
                f"--shape {text}: this command takes one shape, not a range "
                "(optimize and plan take ranges; verify checks a dynamic bundle "
                "across its range when given no --shape)"
            )
    out: dict[str, tuple[int, ...]] = {}
    for name, dims in map(parse_shape, texts):
        if name in out and out[name] != dims:
            raise InputError(f"--shape {name}: given twice with different dimensions")
        out[name] = dims
    return out


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks of internal errors.")
@click.version_option(package_name="orchestrate")
def main(debug: bool) -> None:
    """orchestrate: ONNX in, optimally fused Triton kernels out.

    \b
    Stages, each a command:
      inspect    op counts before and after operator fission
      decompose  write the primitive graph as a plain ONNX model
      plan       choose fused kernels with a binary linear program
      explain    show a plan: kernels, baselines, a picture
      rules      the rules that decide what one kernel can run
      optimize   all of it: fission, plan, Triton emission, verification -> bundle
      run        run a bundle on .npy inputs
      verify     compare a bundle with onnxruntime on random inputs
      bench      time the bundle against torch eager, torch.compile, onnxruntime
      records    export the kernel timings optimize --tune measured (JSON lines)
    """


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write the primitive ONNX model.",
)
@shape_option
@const_option
@reports_errors
def decompose(model: Path, output: Path, shapes, consts) -> None:
    """Split every ONNX operator of MODEL into primitives; write them as ONNX."""
    from orchestrate.plan import pipeline

    pipeline.check_output_path(output, model)
    graph = pipeline.fission_file(model, _shapes(shapes), _consts(consts))
    pipeline.write_primitive_onnx(graph, output, name=model.stem)
    echo(
        f"wrote {output}: {len(graph.nodes)} primitives "
        f"({len(graph.inputs)} inputs, {len(graph.outputs)} outputs, "
        f"{len(graph.constants)} constants)"
    )


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@shape_option
@click.option(
    "--dtype",
    default=None,
    metavar="fp16|bf16|fp32",
    help="Show the primitive graph run at this precision (as optimize --dtype).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option(
    "--dim",
    "dims",
    metavar="SYMBOL=MIN..MAX[@OPT]",
    multiple=True,
    help="A range for a symbolic dimension of the model, e.g. --dim seq=2..64; with it, "
    "or a range in --shape (x=1..8x2..64), show symbolic shapes instead.",
)
@reports_errors
def inspect(model: Path, shapes, dtype, as_json: bool, dims) -> None:
    """Op types and tensor sizes of MODEL, before and after operator fission.

    With a range of shapes (--shape x=1..8x2..64, --dim seq=2..64): the
    symbolic shape of each output (every value with --json), the declared
    ranges, and the nodes symbolic inference declines."""
    from orchestrate.explain.summary import format_inspection, inspection
    from orchestrate.ir.precision import check_dtype
    from orchestrate.plan import pipeline
    from orchestrate.shapes.dims import is_range_text

    if dims or any(map(is_range_text, shapes)):
        _inspect_symbolic(model, shapes, dtype, as_json, dims)
        return
    check_dtype(dtype, "--dtype")
    onnx_model = pipeline.load(model)
    graph = pipeline.fission_model(onnx_model, _shapes(shapes), str(model))
    graph = _lowered(graph, dtype, model)
    info = inspection(onnx_model, graph, source=str(model), dtype=dtype)
    if as_json:
        import json

        echo(json.dumps(info, indent=2))
    else:
        echo(format_inspection(info))


def _inspect_symbolic(model: Path, shapes, dtype, as_json: bool, dims) -> None:
    from orchestrate.errors import InputError
    from orchestrate.plan import pipeline
    from orchestrate.shapes import report
    from orchestrate.shapes.infer import infer_shapes

    if dtype is not None:
        raise InputError(f"--dtype {dtype}: not read with a range of shapes yet")
    given, symbols = _ranges(shapes, dims)
    result = infer_shapes(pipeline.load(model), given, symbols, str(model))
    if as_json:
        import json

        echo(json.dumps(report.as_json(result), indent=2))
    else:
        echo("\n".join(report.lines(result)))


def plan_options(fn):
    """The options every command that plans takes."""
    # click lists these in the reverse of the order they are applied here
    fn = click.option(
        "--reproducible",
        is_flag=True,
        help="Write 0 for wall-clock fields so the file is byte-identical across runs.",
    )(fn)
    fn = click.option(
        "--max-kernel-nodes",
        type=click.IntRange(1, 64),
        default=16,
        show_default=True,
        help="Most primitives in one candidate kernel.",
    )(fn)
    fn = click.option("--tf32", is_flag=True, help="Let fp32 matmuls use TF32 tensor cores.")(fn)
    fn = click.option(
        "--no-rewrites",
        "no_rewrites",
        is_flag=True,
        help="Plan without the pattern rules (attention, merged siblings, norm past "
        "matmul, low rank): only sets enumeration builds.",
    )(fn)
    fn = click.option(
        "--gemm-backends",
        "gemm_backends",
        default="triton,library",
        show_default=True,
        metavar="LIST",
        help="Who may run matmuls, convolutions and attention: generated Triton "
        "kernels, library calls (cuBLAS, cuDNN, SDPA through torch), or both "
        "competing in the linear program.",
    )(fn)
    fn = click.option(
        "--cost",
        default="analytic",
        show_default=True,
        metavar="analytic|learned|FILE",
        help="How kernels are priced: the analytic roofline model, or it corrected "
        "by the learned model (packaged, or a model file from calibrate --train; "
        "needs lightgbm).",
    )(fn)
    fn = click.option(
        "--dtype",
        default=None,
        metavar="fp16|bf16|fp32",
        help="Run an fp32 model in half precision (fp16 or bf16 storage and tensor "
        "cores; fp32 accumulation, softmax and normalisation). Default: the "
        "model's own.",
    )(fn)
    fn = click.option(
        "--no-recompute",
        "no_recompute",
        is_flag=True,
        help="Forbid computing a primitive in more than one kernel.",
    )(fn)
    fn = click.option(
        "--time-limit",
        type=float,
        default=60.0,
        show_default=True,
        metavar="S",
        help="Seconds for planning: enumeration (at most half) and every linear "
        "program together, a --memory-budget's included (the best plan found so far "
        "is kept, at worst the greedy one).",
    )(fn)
    fn = click.option(
        "--memory-budget",
        type=int,
        default=None,
        metavar="BYTES",
        help="Bound the bytes of intermediate tensors the plan materialises.",
    )(fn)
    fn = click.option(
        "--device",
        default=None,
        help="GPU to plan for (h200, h100, a100, v100, l4, rtx4090, ...); "
        "default: the GPU present, else h100.",
    )(fn)
    return fn


def _plan_options(
    device,
    memory_budget,
    time_limit,
    tf32,
    max_kernel_nodes,
    reproducible,
    no_recompute,
    dtype,
    gemm_backends,
    no_rewrites,
    cost,
):
    from orchestrate.errors import InputError
    from orchestrate.plan.candidates import Limits
    from orchestrate.plan.planner import PlanOptionError, PlanOptions

    try:
        return PlanOptions(
            device=device,
            memory_budget=memory_budget,
            time_limit=time_limit,
            tf32=tf32,
            limits=Limits(max_nodes=max_kernel_nodes),
            reproducible=reproducible,
            recompute=not no_recompute,
            dtype=dtype,
            gemm_backends=gemm_backends,
            rewrites=not no_rewrites,
            cost=cost,
        )
    except PlanOptionError as e:  # name the flag, not the field
        flag = _PLAN_FLAGS.get(e.field, e.field)
        raise InputError(f"{flag} {e.value}: {e.problem}") from None


_PLAN_FLAGS = {
    "device": "--device",
    "memory_budget": "--memory-budget",
    "time_limit": "--time-limit",
    "limits.max_nodes": "--max-kernel-nodes",
    "dtype": "--dtype",
    "gemm_backends": "--gemm-backends",
    "cost": "--cost",
}


def _lowered(graph, dtype, model: Path):
    """``graph`` at --dtype, the flag named in the error a model can cause."""
    from orchestrate.ir import precision

    with _dtype_flag():
        return precision.lower_precision(graph, dtype, str(model))


@contextlib.contextmanager
def _dtype_flag():
    """A PrecisionError (the model cannot run at --dtype) naming the flag."""
    from orchestrate.errors import InputError
    from orchestrate.ir.precision import PrecisionError

    try:
        yield
    except PrecisionError as e:
        raise InputError(f"{e.source}: --dtype {e.value}: {e.problem}") from None


def tune_options(fn):
    """--tune and --tune-configs (plan and optimize)."""
    fn = click.option(
        "--tune-configs",
        type=int,
        default=None,
        metavar="N",
        help="With --tune: configurations timed per kernel, the cost model's best N (default 3).",
    )(fn)
    fn = click.option(
        "--tune",
        is_flag=True,
        help="Time each candidate kernel's best configurations on the GPU present "
        "(cached) and plan with the measured times. GPU only.",
    )(fn)
    return fn


def _tuning(tune: bool, configs: int | None, device: str | None):
    """The Tune of --tune, checked before any work: a GPU must be here, and
    be the --device planned for."""
    from orchestrate.errors import InputError

    if not tune:
        if configs is not None:
            raise InputError(f"--tune-configs {configs}: only with --tune")
        return None
    if configs is not None and configs < 1:
        raise InputError(f"--tune-configs {configs}: must be an integer >= 1")
    from orchestrate.cost.devices import detect
    from orchestrate.run.runtime import gpu_available

    if not gpu_available():
        raise InputError(
            "--tune: no CUDA GPU here (torch.cuda.is_available() is false); "
            "tuning times kernels on a GPU"
        )
    present = detect()
    if device is not None and present is not None and device.lower() != present:
        raise InputError(
            f"--tune measures the GPU present ({present}); --device {device} plans for another"
        )
    from orchestrate.tune import Tune
    from orchestrate.tune.gpu import GpuTimer
    from orchestrate.tune.tuner import CONFIGS

    return Tune(GpuTimer(progress=StageProgress()), configs or CONFIGS)


class StageProgress:
    """One line per stage on stderr, rewritten in place on a terminal."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.last = ("", 0)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.tty:
            end = "\n" if done == total else ""
            click.echo(f"\r  {stage:<10} {done}/{total}", err=True, nl=False)
            if end:
                click.echo("", err=True)
        elif done == total or done == 1:
            click.echo(f"  {stage:<10} {done}/{total}", err=True)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write PLAN.json.",
)
@shape_option
@dim_option
@const_option
@plan_options
@tune_options
@reports_errors
def plan(model: Path, output: Path, shapes, dims, consts, tune, tune_configs, **opts) -> None:
    """Choose the kernels for MODEL: fission, candidates, costs, linear program.

    With a range (--shape x=1..8x2..64@32, --dim seq=2..64): the plan at OPT
    whose kernels serve the whole range, and its dimensions in
    OUTPUT.dims.json beside it (explain shows them)."""
    from orchestrate.explain import range_lines, summary_lines
    from orchestrate.plan import pipeline

    ranges = _ranges(shapes, dims)
    consts = _consts(consts)
    loaded = point = None
    if ranges is not None:  # every range a point: the static shape it fixes
        from orchestrate.plan.ranged import point_shapes
        from orchestrate.shapes.binding import Ranges

        loaded = pipeline.load(model, consts, "--const")
        point = point_shapes(loaded, Ranges(*ranges), str(model))
        ranges = ranges if point is None else None
    _no_tune_with_range(tune, ranges)
    tuning = _tuning(tune, tune_configs, opts["device"])
    options = _plan_options(**opts)
    pipeline.check_output_path(output, model)
    family = None
    dims_file = _dims_file(output)
    pipeline.check_output_path(dims_file, model)
    # Read before any work: a static plan replaces a dynamic one's
    # dimensions (removed once the plan is written); a file there that
    # is not a plan's dimensions is refused now, not after writing.
    try:
        stale = _read_family(dims_file) if ranges is None else None
    except InputError as e:
        raise InputError(
            f"{e}; explain would read it as {output.name}'s dimensions: "
            f"remove it or choose another --output"
        ) from None
    if ranges is not None:
        from orchestrate.plan.ranged import build

        made = build(loaded, Ranges(*ranges), options, model.name, str(model), StageProgress())
        result, family = made.plan, made.family
    else:
        graph = (
            pipeline.fission_file(model, _shapes(shapes), consts)
            if point is None
            else pipeline.fission_model(loaded, point, str(model))
        )
        graph = _lowered(graph, options.dtype, model)
        result = pipeline.plan_graph(graph, options, progress=StageProgress(), tune=tuning).plan
    pipeline.write_plan(result, output)
    if stale is not None:
        dims_file.unlink()  # a static plan written over a dynamic one: its dimensions go
    if family is not None:
        import json

        pipeline.write_atomic(dims_file, (json.dumps(family.to_json(), indent=1) + "\n").encode())
        for line in range_lines(family):
            echo(line)
    for line in summary_lines(result):
        echo(line)
    echo(f"wrote {output}" + (f" and {dims_file}" if family is not None else ""))


def _no_tune_with_range(tune: bool, ranges) -> None:
    from orchestrate.errors import InputError

    if tune and ranges is not None:
        raise InputError(
            "--tune: not with a range of shapes yet (it times kernels at one "
            "shape); tune a static shape, or plan the range by the cost model"
        )


def _dims_file(plan_file: Path) -> Path:
    """Where a dynamic plan's dimensions go: OUT.dims.json beside OUT.json
    (in a bundle, dims.json beside plan.json)."""
    return plan_file.with_name(plan_file.stem + ".dims.json")


def _family_beside(plan_file: Path):
    """The dimensions of a dynamic plan (``_dims_file``, or a bundle's
    dims.json), or None for a static one."""
    for path in (_dims_file(plan_file), plan_file.with_name("dims.json")):
        found = _read_family(path)
        if found is not None:
            return found
    return None


def _read_family(path: Path):
    """The Family in ``path``, or None when there is no such file or it
    holds no JSON (a malformed family is an InputError naming the file)."""
    import json

    from orchestrate.shapes.family import Family

    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return Family.from_json(data, str(path))


@main.command()
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--picture",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw the kernels as a graph: Graphviz DOT, rendered by dot for "
    ".svg, .png or .pdf where dot is installed.",
)
@click.option(
    "--roofline",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also chart the kernels on the device's roofline (.png, .svg or .pdf; needs matplotlib).",
)
@click.option("--rejected", is_flag=True, help="Also list fusions that were refused, with reasons.")
@click.option(
    "--limit", type=int, default=40, show_default=True, help="Rows of the kernel table (0: all)."
)
@reports_errors
def explain(
    plan_file: Path, picture: Path | None, roofline: Path | None, rejected: bool, limit: int
) -> None:
    """Show PLAN.json: per-kernel table, totals against both baselines."""
    from orchestrate import explain as ex
    from orchestrate.explain import picture as pic
    from orchestrate.explain import roofline_chart
    from orchestrate.plan import pipeline

    drawn = pic.target(picture) if picture is not None else None
    # explain reads the plan and, beside it, a dynamic plan's dimensions
    reads = (plan_file, _dims_file(plan_file), plan_file.with_name("dims.json"))
    for out in (drawn, roofline):
        for read in reads if out is not None else ():
            what = "the input plan" if read == plan_file else "the plan's dimensions"
            pipeline.check_output_path(out, read, what)
    if roofline is not None:
        roofline_chart.check(roofline)
    result = pipeline.read_plan(plan_file)
    family = _family_beside(plan_file)
    echo(ex.kernel_table(result, limit=limit))
    echo("")
    for line in (ex.range_lines(family) if family is not None else []) + ex.summary_lines(result):
        echo(line)
    if rejected:
        echo("")
        echo(ex.rejected_table(result))
    if drawn is not None:
        pipeline.write_atomic(drawn, pic.picture(result, drawn), plan_file, "the input plan")
        echo(f"wrote {drawn}")
        if drawn != picture:
            echo(
                f"Graphviz's dot is not installed: `dot -T{picture.suffix[1:].lower()} "
                f"{drawn} -o {picture}` renders it where it is"
            )
    if roofline is not None:
        data = roofline_chart.chart(result, roofline.suffix.lower()[1:])
        pipeline.write_atomic(roofline, data, plan_file, "the input plan")
        echo(f"wrote {roofline} (predicted, not measured)")


@main.command()
@reports_errors
def rules() -> None:
    """List the rule table: each rule that makes kernels, one line each."""
    from orchestrate.templates import listing

    for line in listing():
        echo(line)


@main.command()
@click.argument(
    "data", nargs=-1, type=click.Path(exists=False, path_type=Path), metavar="[DATA]..."
)
@click.option("--gpu", "gpus", multiple=True, help="Only rows of this device row (h100, l4, ...).")
@click.option(
    "--runtime",
    "runtimes",
    multiple=True,
    help="Only rows of this runtime: eager, compile, or a runtime's own name.",
)
@click.option("--kind", "kinds", multiple=True, help="Only rows of this kind (matmul, conv, ...).")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write a scatter plot of predicted against measured (PNG; needs matplotlib).",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write every row's prediction and its plan's kernels as JSON.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=None,
    help="Processes planning the rows' programs (default: the CPUs, at most 8).",
)
@click.option(
    "--cost",
    default="analytic",
    show_default=True,
    metavar="analytic|learned|FILE",
    help="Set this model against the measurements: the analytic one, or it "
    "corrected by a learned model (needs lightgbm).",
)
@click.option(
    "--train",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Train a learned model on the chosen rows and write it here (needs lightgbm).",
)
@click.option(
    "--transfer",
    is_flag=True,
    help="Leave each GPU out: train on the others, adapt with k of its rows "
    "(k = 0, 5, 10, 20, 50, chosen to cover its programs) and print the fit on "
    "the rest (needs lightgbm).",
)
@click.option(
    "--curves",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --transfer: write its learning curves (PNG; needs matplotlib).",
)
@click.option(
    "--pca",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the learned model's feature space by GPU, its two principal "
    "components (PNG; needs matplotlib).",
)
@click.option(
    "--records",
    "records_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Our own kernels' records (orchestrate records export, make bench-gpu's "
    "records.jsonl): alone, set against the model per GPU and template; with --train, "
    "--transfer or --pca, learnt from beside the published rows.",
)
@reports_errors
def calibrate(
    data,
    gpus,
    runtimes,
    kinds,
    plot: Path | None,
    json_out: Path | None,
    jobs: int | None,
    cost: str,
    train: Path | None,
    transfer: bool,
    curves: Path | None,
    pca: Path | None,
    records_files: tuple[Path, ...],
) -> None:
    """Set the cost model's predictions against published GPU measurements.

    DATA are measurement files or folders of JSON lines (default: the
    project's data/measurements).  Each row's program is planned for its GPU
    and priced as the runtime that timed it runs it (eager: one kernel per
    op with library GEMMs; torch.compile: the fused plan, its GEMMs library
    calls unless in a max-autotune mode), then the tables give,
    per GPU, runtime and kind, the geometric mean of predicted / measured,
    the typical error factor, Spearman's rank correlation and the share
    within 2x.  Predicted times are the model's; measured ones published.

    With --train, --transfer or --pca the learned model (gradient-boosted
    trees over the analytic model's terms) is trained, studied across GPUs
    or its features drawn.  With --records alone, our own kernels' measured
    times (the records --tune and make bench-gpu write) are set against the
    model instead; with --train, --transfer or --pca as well, the model
    learns from them beside the published rows."""
    from orchestrate import calibrate as cal
    from orchestrate.calibrate.report import scatter
    from orchestrate.calibrate.run import calibrate as run_calibrate
    from orchestrate.calibrate.run import write_json
    from orchestrate.plan import pipeline
    from orchestrate.plan.planner import PlanOptionError, PlanOptions

    kernel_records = None
    if records_files:
        from orchestrate.calibrate import records

        learning = [
            f for f, v in (("--train", train), ("--transfer", transfer), ("--pca", pca)) if v
        ]
        others = [f for f, v in (("DATA", data), ("--plot", plot), ("--json", json_out)) if v]
        if others and not learning:
            raise InputError(
                f"--records alone reports kernel records: not with {others[0]} "
                "(give --train, --transfer or --pca to learn from them beside the rows)"
            )
        kinds_of_rows = [f for f, v in (("--runtime", runtimes), ("--kind", kinds)) if v]
        if kinds_of_rows:
            raise InputError(
                f"--records: a kernel record has no {kinds_of_rows[0][2:]} to choose by "
                "(only --gpu chooses records)"
            )
        kernel_records = records.read(records_files, gpus)
        if not learning:
            echo(records.text(kernel_records), nl=False)
            return
    if curves is not None and not transfer:
        raise InputError("--curves draws the --transfer study: give --transfer too")
    for out in (plot, json_out, train, curves, pca):
        if out is not None:
            pipeline.check_output_path(out)
    for flag, out in (("--plot", plot), ("--curves", curves), ("--pca", pca)):
        if out is not None:
            _needs_matplotlib(flag)
    try:
        model_file = PlanOptions(cost=cost).cost_file
    except PlanOptionError as e:
        raise InputError(f"--cost {e.value}: {e.problem}") from None
    if model_file is not None or train or transfer:
        from orchestrate.cost import learned

        learned.lightgbm()  # before the long part: say now if it is missing
        model = None if model_file is None else learned.load(model_file)
    stage = StageProgress()
    found, skipped = run_calibrate(
        list(data),
        gpus,
        runtimes,
        kinds,
        progress=lambda i, n: stage("calibrate", i, n),
        jobs=jobs or min(8, os.cpu_count() or 1),
    )
    analytic = found
    if model_file is not None:
        from orchestrate.calibrate.learn import apply

        found = apply(model, found)
        echo(f"predictions corrected by {model.name}")
    echo(cal.text(found, skipped), nl=False)
    if json_out is not None:
        write_json(found, skipped, json_out)
        echo(f"wrote {json_out}")
    if plot is not None:
        scatter(found, plot, "orchestrate calibrate: predicted (cost model) vs measured")
        echo(f"wrote {plot} (predicted against published measurements)")
    kept = () if kernel_records is None else kernel_records.kept
    if kernel_records is not None:
        echo("")
        echo(records.text(kernel_records), nl=False)
    if train or transfer or pca:
        from orchestrate.calibrate import learn

        rows = learn.samples(analytic, kept)
    if train is not None:
        chosen = [p.measurement for p in analytic] + [s.measurement for s in skipped]
        trained = learn.train(rows, learn.data_hash(chosen, kept))
        pipeline.write_atomic(train, trained.to_json().encode())
        joined = f" and {len(kept)} kernel records" if kept else ""
        echo(
            f"wrote {train}: learned model over {len(rows) - len(kept)} rows{joined} on "
            f"{', '.join(trained.trained_on)} (data sha256:{trained.data[:16]})"
        )
    if transfer:
        from orchestrate.calibrate import transfer_report

        points = learn.transfer(rows, progress=lambda i, n: stage("transfer", i, n))
        echo("")
        echo(transfer_report.text(points), nl=False)
        if curves is not None:
            transfer_report.curves(points, curves)
            echo(f"wrote {curves}")
    if pca is not None:
        from orchestrate.calibrate import transfer_report

        p = transfer_report.pca(rows)
        echo("")
        echo(transfer_report.pca_text(p), nl=False)
        transfer_report.pca_plot(p, pca)
        echo(f"wrote {pca}")


def _needs_matplotlib(flag: str) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(f"{flag} needs matplotlib (pip install matplotlib)") from None


def _tolerances(rtol, atol):
    """--rtol and --atol, refused (naming the flag) unless finite and >= 0."""
    from orchestrate.check.verify import check_tolerance

    return check_tolerance(rtol, "--rtol"), check_tolerance(atol, "--atol")


def tolerance_options(fn):
    fn = click.option(
        "--atol",
        type=float,
        default=None,
        help="Absolute tolerance (default: rtol x the output's largest magnitude).",
    )(fn)
    fn = click.option(
        "--rtol",
        type=float,
        default=None,
        help="Relative tolerance (default by dtype: fp32 1e-4, fp16 1e-2, bf16 4e-2).",
    )(fn)
    return fn


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Bundle folder to write (replaced only if it is a bundle).",
)
@shape_option
@dim_option
@const_option
@plan_options
@click.option(
    "--trials",
    type=click.IntRange(0, 100),
    default=2,
    show_default=True,
    help="Random-input verification trials before success (0 skips). With a range "
    "of shapes: MIN, OPT and MAX are always checked, and N random shapes "
    "between.",
)
@tolerance_options
@draw_options
@tune_options
@click.option(
    "--in-place-cache/--no-in-place-cache",
    default=True,
    show_default=True,
    help="For a decode step over a range of past lengths, also plan the step over "
    "caches kept in place (in_place/ in the bundle), which generate decodes with.",
)
@reports_errors
def optimize(
    model: Path,
    out_dir: Path,
    shapes,
    dims,
    consts,
    trials,
    rtol,
    atol,
    input_ranges,
    input_files,
    tune,
    tune_configs,
    in_place_cache,
    **opts,
) -> None:
    """Optimize MODEL into a bundle of Triton kernels, verified against its float64 reference.

    With a range (--shape x=1..8x2..64@32, --dim seq=2..64): one bundle for
    every shape in it, planned at OPT, verified at MIN, OPT, MAX and --trials
    random shapes between."""
    from orchestrate import api, explain

    ranges = _ranges(shapes, dims)
    _no_tune_with_range(tune, ranges)
    tuning = _tuning(tune, tune_configs, opts["device"])
    rtol, atol = _tolerances(rtol, atol)
    given = (
        dict(shapes=_shapes(shapes)) if ranges is None else dict(shapes=ranges[0], dims=ranges[1])
    )
    with _dtype_flag():
        result = api.optimize(
            model,
            out_dir,
            **given,
            options=_plan_options(**opts),
            trials=trials,
            rtol=rtol,
            atol=atol,
            progress=StageProgress(),
            tune=tuning,
            constants=_consts(consts),
            **_draw_args(input_ranges, input_files),
            in_place_cache=in_place_cache,
            _shape_option="--shape",
            _const_option="--const",
        )
    echo(explain.kernel_table(result.plan, limit=25))
    echo("")
    lines = explain.range_lines(result.family) if result.family is not None else []
    for line in lines + explain.summary_lines(result.plan):
        echo(line)
    if result.report is not None:
        echo("")
        for line in result.report.lines():
            echo(line)
        echo(result.report.verdict(trials))
    if result.in_place:
        echo(result.in_place)
    echo(f"wrote {result.path}/")


@main.group()
def records() -> None:
    """The kernel timings optimize --tune measured (its cache), as training data."""


@records.command("export")
@click.argument("out", metavar="OUT.jsonl", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--device",
    default=None,
    help="Only this GPU's measurements (its name, or a device row such as h200).",
)
@click.option(
    "--cache",
    "cache_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The measurement cache (default: the user's cache directory, "
    "$ORCHESTRATE_CACHE_DIR or $XDG_CACHE_HOME/orchestrate).",
)
@reports_errors
def records_export(out: Path, device: str | None, cache_path: Path | None) -> None:
    """Write one JSON line per measurement to OUT.jsonl (schema in orchestrate/tune/records.py)."""
    from orchestrate.tune.export import export
    from orchestrate.tune.records import RECORDS_SCHEMA

    n, skipped = export(out, device, cache_path)
    damaged = f"; {skipped} damaged rows skipped" if skipped else ""
    echo(f"wrote {out}: {n} measurement{'s' if n != 1 else ''} ({RECORDS_SCHEMA}){damaged}")


def _parse_inputs(texts) -> dict[str, Path]:
    """--input NAME=FILE options as {NAME: FILE}; each NAME at most once."""
    from orchestrate.errors import InputError

    out: dict[str, Path] = {}
    for text in texts:
        name, sep, file = text.partition("=")
        if not sep or not name or not file:
            raise InputError(f"--input {text!r}: expected NAME=FILE.npy")
        if name in out:
            raise InputError(f"--input {name}: given twice ({out[name]} and {file})")
        out[name] = Path(file)
    return out


@main.command()
@click.argument("bundle_dir", metavar="OUT", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input array (repeatable)."
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write each output to DIR/<name>.npy.",
)
@reports_errors
def run(bundle_dir: Path, inputs, output_dir: Path | None) -> None:
    """Run the bundle OUT on .npy inputs."""
    from orchestrate import api
    from orchestrate.files import iofiles

    files = _parse_inputs(inputs)
    if output_dir is not None:
        iofiles.check_output_dir(output_dir)
    model = api.load(bundle_dir)
    if output_dir is not None:
        iofiles.check_destinations(model.outputs, output_dir, files)
    feeds = iofiles.read_inputs(files)
    model.check_inputs(feeds)
    outputs = model.run(feeds)
    written = iofiles.write_outputs(outputs, output_dir, files) if output_dir else []
    for name, arr in outputs.items():
        finite = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr
        stats = (
            f"min {finite.min():.4g} max {finite.max():.4g}" if finite.size else "no finite values"
        )
        echo(f"{name}: {arr.dtype}{list(arr.shape)} {stats}")
    if output_dir is not None:
        echo(f"wrote {len(written)} outputs to {output_dir}/")


def _token_ids(text: str) -> list[int]:
    from orchestrate.errors import InputError

    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise InputError(f"--prompt-ids {text!r}: expected token ids, comma-separated") from None
    if any(t < 0 for t in ids):
        raise InputError(f"--prompt-ids {text!r}: token ids are not negative")
    return ids


@main.command()
@click.argument("bundle_dir", metavar="OUT", type=click.Path(file_okay=False, path_type=Path))
@click.option("--prompt-ids", required=True, metavar="IDS", help="The prompt's token ids: 1,2,3.")
@click.option("--max-new-tokens", type=click.IntRange(1, 1_000_000), default=16, show_default=True)
@click.option("--sample", is_flag=True, help="Sample from the softmax instead of the argmax.")
@click.option("--seed", type=int, default=0, show_default=True, help="With --sample.")
@click.option(
    "--temperature",
    type=click.FloatRange(0, min_open=True),
    default=1.0,
    show_default=True,
    help="With --sample.",
)
@click.option(
    "--concat",
    is_flag=True,
    help="Decode over the graph's own step (present fed back) even where the "
    "bundle keeps the caches in place.",
)
@click.option(
    "--prefill",
    "prefill_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A bundle of the prompt step (examples/decode.py --prefill) that runs the "
    "whole prompt at once; without it the prompt is fed a token a step.",
)
@reports_errors
def generate(
    bundle_dir: Path,
    prompt_ids: str,
    max_new_tokens: int,
    sample: bool,
    seed: int,
    temperature,
    concat: bool,
    prefill_dir: Path | None,
) -> None:
    """Decode tokens with the decode-step bundle OUT (made for a range of past
    lengths, --dim past=MIN..MAX): greedy, or --sample.  The prompt runs in
    one step with --prefill, else a token per step; the caches are kept in place (the bundle's in_place/
    step, one row written a step), or with --concat grown by the graph's own
    step."""
    from orchestrate import api

    ids = _token_ids(prompt_ids)
    model = api.load(bundle_dir)
    prefill = None if prefill_dir is None else api.load(prefill_dir)
    made = model.generate(
        ids,
        max_new_tokens,
        sample=sample,
        seed=seed,
        temperature=temperature,
        in_place=not concat,
        prefill=prefill,
    )
    echo(",".join(str(t) for t in made.tokens))
    where = "Triton interpreter" if model.interpret else "GPU"
    kept = "kept in place" if made.in_place else "grown by the step's concat"
    kept += "; the prompt in one step" if prefill is not None else ""
    echo(
        f"{len(made.tokens)} tokens in {made.steps} steps, {made.seconds:.2f} s "
        f"({made.tokens_per_second:.1f} tokens/s, {where}); caches {kept}, "
        f"{made.cache_bytes[0]:,} to {made.cache_bytes[-1]:,} bytes stored a step"
    )
    b = model.token_bytes(in_place=made.in_place)
    echo(
        f"predicted bytes per token at past={b.past}: {b.predicted:,} against a floor of "
        f"{b.floor:,} (weights {b.weights:,} + cache read {b.cache:,}): {b.predicted / b.floor:.2f}x"
    )


@main.command()
@click.argument("bundle_dir", metavar="OUT", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--model",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The ONNX model the bundle must match.",
)
@shape_option
@click.option("--trials", type=click.IntRange(1, 1000), default=3, show_default=True)
@tolerance_options
@click.option(
    "--exact",
    is_flag=True,
    help="Instead: check exactly, in modular arithmetic, that the plan computes the "
    "function of MODEL's primitive graph (Mirage's fingerprint) where the "
    "fragment of add, mul, matmul, sums and one exp reaches.",
)
@draw_options
@reports_errors
def verify(
    bundle_dir: Path, model: Path, shapes, trials, rtol, atol, exact, input_ranges, input_files
) -> None:
    """Check that bundle OUT computes what MODEL computes (exit 1 if not)."""
    from orchestrate import api

    if exact and (bundle_dir / "dims.json").exists():
        _verify_exact_range(bundle_dir, model, shapes)
        return
    if exact:
        from orchestrate.check.exact.bundle import verify_exact

        result = verify_exact(bundle_dir, model, _shapes(shapes) or None)
        for line in result.lines():
            echo(line)
        bad = result.mismatch
        if bad is not None:
            _fail(
                f"{bundle_dir} does not compute what {model} computes: tensor {bad.tensor!r}"
                f"{f' (trial {bad.trial})' if bad.trial >= 0 else ''}: {bad.detail}",
                EXIT_MISMATCH,
            )
        if not result.ok:
            _fail(
                f"the false-pass bound {result.bound:.3g} did not fall below 1e-9 in "
                f"{result.trials} trials",
                EXIT_MISMATCH,
            )
        echo(
            f"OK: the plan computes the original's function on the fragment "
            f"(false-pass bound {result.bound:.3g})"
        )
        return
    rtol, atol = _tolerances(rtol, atol)
    report = api.verify_bundle(
        bundle_dir,
        model,
        shapes=_shapes(shapes) or None,
        trials=trials,
        rtol=rtol,
        atol=atol,
        **_draw_args(input_ranges, input_files),
        _shape_option="--shape",
    )
    for line in report.lines():
        echo(line)
    bad = report.first_failure()
    if bad is not None:
        where = f"at {report.bindings[bad.trial]}" if report.bindings else f"(trial {bad.trial})"
        _fail(
            f"{bundle_dir} does not match {model}: output {bad.name!r} {where}: {bad.detail}",
            EXIT_MISMATCH,
        )
    if report.bindings:
        echo(
            f"OK: {len(report.worst())} outputs match the float64 reference at "
            f"{len(report.bindings)} shapes: {'; '.join(report.bindings)}"
        )
    else:
        echo(f"OK: {len(report.worst())} outputs match the float64 reference over {trials} trials")


def _verify_exact_range(bundle_dir: Path, model: Path, shapes) -> None:
    """verify --exact of a dynamic bundle: the plan at MIN, OPT and MAX."""
    from orchestrate.check.exact.bundle import verify_exact_range
    from orchestrate.errors import InputError

    if shapes:
        raise InputError(
            "--shape: verify --exact checks a dynamic bundle at MIN, OPT and MAX "
            "of its range; give no --shape"
        )
    for where, result in verify_exact_range(bundle_dir, model):
        echo(f"at {where}:")
        for line in result.lines():
            echo(f"  {line}")
        bad = result.mismatch
        if bad is not None:
            _fail(
                f"{bundle_dir} does not compute what {model} computes at {where}: tensor "
                f"{bad.tensor!r}: {bad.detail}",
                EXIT_MISMATCH,
            )
        if not result.ok:
            _fail(
                f"at {where}: the false-pass bound {result.bound:.3g} did not fall below 1e-9 "
                f"in {result.trials} trials",
                EXIT_MISMATCH,
            )
    echo("OK: the plan computes the original's function on the fragment at MIN, OPT and MAX")


@main.command()
@click.argument("target", metavar="MODEL.onnx|OUT", type=click.Path(path_type=Path))
@click.option(
    "--model",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="For a bundle OUT: the ONNX model it was made from (the baselines run it).",
)
@click.option(
    "--against",
    default=None,
    metavar="LIST",
    help="Baselines, comma-separated: eager, compile, compile-max-autotune, ort-cuda, "
    "ort-cpu. Default: all (ort-cpu only without a GPU).",
)
@click.option(
    "--dtype",
    default=None,
    metavar="fp16|bf16|fp32",
    help="Optimize MODEL.onnx at this precision; the baselines run at it too.",
)
@click.option("--device", default=None, help="Plan for this GPU (default: the one present).")
@shape_option
@click.option("--runs", type=click.IntRange(1, 10000), default=20, show_default=True)
@click.option("--warmup", type=click.IntRange(0, 1000), default=3, show_default=True)
@click.option(
    "--inputs",
    "sets",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Random input sets, rotated through the timed calls.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the results document here.",
)
@click.option(
    "--chart",
    "chart_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Draw the results as a PNG here (needs matplotlib).",
)
@reports_errors
def bench(
    target: Path, model, against, dtype, device, shapes, runs, warmup, sets, json_path, chart_path
) -> None:
    """Time MODEL.onnx optimized (or bundle OUT) against torch eager, torch.compile and
    onnxruntime, on the same inputs and clock; report latency, memory, ready time and
    the roofline floor."""
    import json

    from orchestrate.bench import clock, report, runtimes
    from orchestrate.bench.run import Settings, bench_model
    from orchestrate.bench.target import resolve
    from orchestrate.errors import InputError
    from orchestrate.ir.precision import check_dtype

    check_dtype(dtype, "--dtype")
    on_gpu = clock.cuda()
    try:
        keys = (
            runtimes.against(against.split(","))
            if against is not None
            else runtimes.DEFAULT_GPU
            if on_gpu
            else runtimes.DEFAULT_CPU
        )
    except ValueError as e:
        raise InputError(str(e)) from None
    from orchestrate.plan import pipeline

    for path, suffix in ((json_path, ".json"), (chart_path, ".png")):
        if path is None:
            continue
        if path.suffix.lower() != suffix:
            raise InputError(f"{path}: expected a {suffix} file name")
        path.parent.mkdir(parents=True, exist_ok=True)
        # never a file bench reads, nor one inside a bundle (checked before the timing)
        pipeline.check_output_path(path, target, "what bench times")
        pipeline.check_output_path(path, model, "the model")
    t = resolve(target, model, _shapes(shapes), dtype=dtype, device=device)
    try:
        result = bench_model(
            t.name,
            t.bundle,
            t.model,
            t.graph,
            keys,
            Settings(runs, warmup, sets, on_gpu),
            optimize_s=t.optimize_s,
            verified=t.verified,
            verify_note=t.verify_note,
        )
    finally:
        t.close()
    interpreter = bool(t.bundle.interpret)
    for line in report.table(result, interpreter):
        echo(line)
    doc = report.document(
        [report.model_record(result)],
        device=_device_name(on_gpu),
        clock=clock.clock_name(on_gpu),
        interpreter=interpreter,
    )
    if json_path is not None:
        pipeline.write_atomic(json_path, (json.dumps(doc, indent=2) + "\n").encode(), target)
        echo(f"wrote {json_path}")
    if chart_path is not None:
        echo(report.chart(doc, chart_path))


def _device_name(on_gpu: bool) -> str:
    if on_gpu:
        import torch

        return torch.cuda.get_device_name(0)
    return "CPU (Triton interpreter)"


if __name__ == "__main__":
    main()
