"""The `gpu` tier (make test-gpu): compiled Triton kernels and CUDA graphs.

Skipped on machines without CUDA (tests/conftest.py).  Each test compiles
real kernels, so they cover what the interpreter cannot: dtypes and layouts
the compiler checks, whether every kernel fits the GPU (no OutOfResources),
the CUDA-graph replay of a whole plan, and CUDA tensors read and returned
in place.  The tier's own bookkeeping (which models, dtypes, tolerances, and
how a test sees the pointers a kernel is given) is checked on any machine by
the unmarked tests at the end.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from examples import EXAMPLES
from examples.build import build_all
from orchestrate import api
from orchestrate.check import verify
from orchestrate.cost import devices
from orchestrate.emit import emit
from orchestrate.frontend import onnxrt
from orchestrate.ir import reference
from orchestrate.run.runtime import Program, load_kernels
from tests import graphs
from tests.emit_util import plan_from_sets

gpu = pytest.mark.gpu

# The --dtype values every example is compiled and checked at.  bf16 is not
# here on purpose: it is tested in tests/ir/test_precision.py by the author of
# bf16 support, who adds it here once it runs on a GPU.
DTYPES = ("fp32", "fp16")

# where `make examples` / `python -m examples.build --out examples/models` writes
MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"

# every example of examples/build.py (tiny size) at every dtype, id "bert-fp16"
EXAMPLE_CASES = [pytest.param(n, d, id=f"{n}-{d}") for n in EXAMPLES for d in DTYPES]


def gpu_device() -> str:
    """The devices.py row to plan for: the GPU present's when the table has
    it, else the default (h100)."""
    return devices.detect() or devices.DEFAULT_DEVICE


def rtol_for(dtype: str) -> float:
    """The verification tolerance at ``dtype``: the one ``optimize`` and
    ``verify`` use (fp16: precision.RTOL, 1e-2; fp32: verify.RTOL, 1e-4)."""
    return api.default_rtol(dtype, False) or verify.RTOL["float32"]


def example_model(name: str, folder: Path) -> Path:
    """examples/models/tiny_<name>.onnx when it was built there, else the
    example built into ``folder`` as examples/build.py builds it."""
    shipped = MODELS / f"tiny_{name}.onnx"
    if shipped.exists():
        return shipped
    built = folder / f"tiny_{name}.onnx"
    if not built.exists():
        build_all(folder, [name])
    return built


@pytest.fixture(scope="module")
def bundle_of(tmp_path_factory):
    """(name, dtype) -> (bundle path, model path): the example optimized for
    this GPU at ``dtype`` (unverified: the tests verify), made on first use."""
    made: dict[tuple[str, str], tuple[Path, Path]] = {}
    models = tmp_path_factory.mktemp("models")
    bundles = tmp_path_factory.mktemp("bundles")

    def get(name: str, dtype: str) -> tuple[Path, Path]:
        if (name, dtype) not in made:
            src = example_model(name, models)
            out = bundles / f"{name}-{dtype}.orch"
            api.optimize(src, out, device=gpu_device(), dtype=dtype, trials=0)
            made[name, dtype] = out, src
        return made[name, dtype]

    return get


def assert_matches(got, want, rtol: float, what: str) -> None:
    """Every output within ``rtol`` of onnxruntime's, as verify judges."""
    for name, w in want.items():
        g = got[name].cpu().numpy() if isinstance(got[name], torch.Tensor) else got[name]
        check = verify.compare(name, np.asarray(g), np.asarray(w), 0, rtol, None)
        assert check.ok, f"{what}: output {name!r}: {check.detail}"


def launch_pointers(program: Program) -> list[set[int]]:
    """Wrap each kernel launcher of ``program`` to record the data pointers of
    the tensors it is given, one set per launch, in the list returned.  (A
    replayed CUDA graph calls no launcher: record with cuda_graph=False.)"""
    seen: list[set[int]] = []

    def recording(launch):
        def launch_and_record(*args, **kwargs):
            seen.append({a.data_ptr() for a in args if isinstance(a, torch.Tensor)})
            return launch(*args, **kwargs)

        return launch_and_record

    program._steps = [(recording(launch), args) for launch, args in program._steps]
    return seen


def _pair(b, x, y):
    return b.tanh(b.add(x, y)), b.mul(b.exp(x), y)


def _pair_program(device: str, cuda_graph: bool) -> tuple:
    """(graph, Program) of ``_pair`` on float inputs (no gathers: a run needs
    nothing from the host), one kernel per node."""
    g = graphs.build(_pair, [(6, 10), (6, 10)])
    planned = plan_from_sets(g, [[n.name] for n in g.nodes])
    interpret = device == "cpu"
    module = load_kernels(emit(g, planned), interpret)
    return g, Program(planned, g, module, interpret=interpret, cuda_graph=cuda_graph)


def check_kernels_read_the_callers_tensors(device: str) -> None:
    """Program.run on torch tensors on ``device`` (no CUDA graph): each input
    tensor itself (its data pointer) is given to a kernel, the outputs are
    tensors on the same device, and an input changed in place between runs
    changes the result as the reference says."""
    g, program = _pair_program(device, cuda_graph=False)
    pointers = launch_pointers(program)
    x = {k: torch.from_numpy(v).to(device) for k, v in graphs.random_inputs(g).items()}
    for _ in range(2):
        pointers.clear()
        got = program.run(x)
        assert set().union(*pointers) >= {t.data_ptr() for t in x.values()}
        want = reference.run(g, {k: t.cpu().numpy() for k, t in x.items()})
        for name, t in got.items():
            assert isinstance(t, torch.Tensor) and t.device == x["x0"].device, name
            np.testing.assert_allclose(t.cpu().numpy(), want[name], rtol=1e-5, atol=1e-6)
        x["x0"].mul_(-2)  # in place: the next run must read the new values


# -- kernels compiled from hand-made plans ------------------------------------


def _run_compiled(graph, plan, inputs):
    program = Program(
        plan, graph, load_kernels(emit(graph, plan), False), interpret=False, cuda_graph=False
    )
    return program.run(inputs)


@gpu
@pytest.mark.parametrize(
    "fn, shapes, dtype, tol",
    [
        (graphs.softmax, [(1000, 4099)], "float32", 1e-5),
        (graphs.layernorm, [(257, 768), (768,), (768,)], "float32", 1e-5),
        (graphs.mlp, [(129, 96), (96, 384), (384,), (384, 96)], "float32", 1e-4),
        (graphs.mlp, [(129, 96), (96, 384), (384,), (384, 96)], "float16", 2e-2),
        (graphs.exp_into_two_reductions, [(333, 517)], "float32", 1e-5),
    ],
)
def test_planned_kernels_compile_and_match_reference(fn, shapes, dtype, tol):
    from orchestrate.plan.planner import PlanOptions, plan

    g = graphs.build(fn, shapes, dtype=dtype)
    p = plan(g, PlanOptions(reproducible=True))
    inputs = {k: (v * 0.5).astype(dtype) for k, v in graphs.random_inputs(g).items()}
    got = _run_compiled(g, p, inputs)
    want = reference.run(g, inputs, float64=True)
    for o in g.outputs:
        scale = float(np.abs(want[o]).max())
        np.testing.assert_allclose(got[o].astype(np.float64), want[o], rtol=tol, atol=tol * scale)


@gpu
def test_conv_and_pool_compile():
    def net(b, x, w):
        c = b.relu(b.conv(x, w, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1))
        return b.pool(c, "max", kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), dilations=(1, 1))

    g = graphs.build(net, [(2, 16, 33, 35), (32, 16, 3, 3)])
    names = [n.name for n in g.nodes]
    p = plan_from_sets(g, [names[:-1], names[-1:]])
    inputs = graphs.random_inputs(g)
    got = _run_compiled(g, p, inputs)
    want = reference.run(g, inputs, float64=True)
    np.testing.assert_allclose(got[g.outputs[0]], want[g.outputs[0]], rtol=1e-4, atol=1e-4)


# -- every example, optimized for this GPU ------------------------------------


@gpu
@pytest.mark.parametrize("name, dtype", EXAMPLE_CASES)
def test_example_compiles_runs_and_matches_onnxruntime(bundle_of, name, dtype):
    """Every kernel of the plan made for this GPU compiles and launches (no
    OutOfResources), and one run matches onnxruntime at the dtype's tolerance."""
    from triton.runtime.errors import OutOfResources

    out, src = bundle_of(name, dtype)
    try:
        report = api.verify_bundle(out, src, trials=1, rtol=rtol_for(dtype))
    except OutOfResources as e:
        pytest.fail(f"{name} at {dtype}, planned for {gpu_device()}: a kernel does not fit: {e}")
    assert report.ok, "\n".join(report.lines())


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_bundle_on_gpu_replays_a_cuda_graph(bundle_of, dtype):
    """The CUDA graph is on by default.  Run 1 compiles, run 2 captures, runs
    3-5 replay the same graph on new inputs (numpy arrays, then CUDA tensors);
    every result, compared after all the runs, is onnxruntime's on its own
    inputs: a replay neither reads stale inputs nor overwrites a result given
    out earlier."""
    out, src = bundle_of("bert", dtype)
    model, onnx_model, graph = api.bundle_and_model(out, src)
    assert not model.interpret and model.program.use_cuda_graph, "CUDA graph on by default"
    feeds = [verify.random_inputs(graph, seed) for seed in range(5)]
    got = []
    for i, f in enumerate(feeds):
        if i == 4:
            f = {k: torch.from_numpy(v).cuda() for k, v in f.items()}
        got.append(model.run(f))
        if i == 1:
            captured = model.program._graph
            assert captured is not None, "run 2 captured the plan"
    assert model.program._graph is captured, "runs 3-5 replayed the one captured graph"
    assert all(t.is_cuda for t in got[4].values())
    session = onnxrt.reference(onnx_model, str(src))
    names = [o.name for o in session.get_outputs()]
    for i, f in enumerate(feeds):
        want = dict(zip(names, session.run(names, f)))
        assert_matches(got[i], want, rtol_for(dtype), f"run {i + 1}")


# -- torch tensors in and out, no copy through the host -----------------------


@gpu
def test_kernels_read_the_callers_cuda_tensors():
    check_kernels_read_the_callers_tensors("cuda")


@gpu
def test_a_replayed_graph_takes_and_gives_cuda_tensors_without_the_host(monkeypatch):
    """Replays on CUDA tensors: no tensor goes through the host (no .cpu(),
    .numpy(), .tolist() or .item(), and no synchronising copy: CUDA's sync
    debug mode errors on one), and each replay reads the caller's tensor as
    it is now (changed in place between runs)."""
    g, program = _pair_program("cuda", cuda_graph=True)
    x = {k: torch.from_numpy(v).cuda() for k, v in graphs.random_inputs(g).items()}
    program.run(x)
    program.run(x)
    assert program._graph is not None
    runs = []

    def through_the_host(*args, **kwargs):
        raise AssertionError("a tensor copied through the host")

    for method in ("cpu", "numpy", "tolist", "item"):
        monkeypatch.setattr(torch.Tensor, method, through_the_host)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            runs.append(({k: t.clone() for k, t in x.items()}, program.run(x)))
            x["x0"].mul_(-2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        monkeypatch.undo()
    for inputs, got in runs:
        want = reference.run(g, {k: t.cpu().numpy() for k, t in inputs.items()})
        for name, t in got.items():
            assert t.device == x["x0"].device, name
            np.testing.assert_allclose(t.cpu().numpy(), want[name], rtol=1e-5, atol=1e-6)


@gpu
def test_a_resident_input_is_read_where_it_lies_by_the_replayed_graph():
    """A resident input (a decode step's cache buffer) is not copied into the
    captured graph: changed in place between replays, the replay reads it as
    it is now; given at another address, the graph is captured again."""
    g, program = _pair_program("cuda", cuda_graph=True)
    x = {k: torch.from_numpy(v).cuda() for k, v in graphs.random_inputs(g).items()}
    resident = frozenset({"x0"})
    program.run(x, resident)
    program.run(x, resident)
    captured = program._graph
    assert captured is not None and program._static["in"]["x0"] is x["x0"]
    for _ in range(2):
        x["x0"].mul_(-2)
        got = program.run(x, resident)
        want = reference.run(g, {k: t.cpu().numpy() for k, t in x.items()})
        for name, t in got.items():
            np.testing.assert_allclose(t.cpu().numpy(), want[name], rtol=1e-5, atol=1e-6)
    assert program._graph is captured
    moved = {**x, "x0": x["x0"].clone()}
    program.run(moved, resident)
    assert program._graph is not captured and program._static["in"]["x0"] is moved["x0"]


@gpu
@pytest.mark.parametrize("name", ["resnet", "bert"])
def test_bundle_run_takes_and_gives_cuda_tensors(bundle_of, name):
    """Bundle.run on CUDA tensors (float images; integer ids whose gathers are
    checked on the device) gives CUDA tensors on that device, equal to the
    numpy path's outputs and to onnxruntime's, over a compile, a capture and
    replays."""
    out, src = bundle_of(name, "fp32")
    model, onnx_model, graph = api.bundle_and_model(out, src)
    for seed in range(3):
        feeds = verify.random_inputs(graph, seed)
        tensors = {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}
        device = next(iter(tensors.values())).device
        got = model.run(tensors)
        want = model.run(feeds)
        for o, t in got.items():
            assert isinstance(t, torch.Tensor) and t.device == device, o
            np.testing.assert_allclose(t.cpu().numpy(), want[o], rtol=1e-6, atol=1e-6)
        assert_matches(got, onnxrt.run(onnx_model, feeds), rtol_for("fp32"), f"seed {seed}")
    assert model.program._graph is not None


# -- the tier's own bookkeeping, checked on any machine -----------------------


def test_the_tier_covers_every_example_at_fp32_and_fp16(tmp_path):
    assert [p.id for p in EXAMPLE_CASES] == [f"{n}-{d}" for n in EXAMPLES for d in ("fp32", "fp16")]
    assert len(EXAMPLE_CASES) == 2 * len(EXAMPLES) >= 22
    assert rtol_for("fp32") == 1e-4 and rtol_for("fp16") == 1e-2
    assert gpu_device() in devices.DEVICES
    assert example_model("bert", tmp_path) == MODELS / "tiny_bert.onnx"  # shipped
    if not (MODELS / "tiny_resnet.onnx").exists():
        assert example_model("resnet", tmp_path) == tmp_path / "tiny_resnet.onnx"
        assert (tmp_path / "tiny_resnet.onnx").stat().st_size > 0


def test_kernels_read_the_callers_tensors_in_the_interpreter():
    check_kernels_read_the_callers_tensors("cpu")
