"""Gather indices are checked as onnxruntime checks them (orchestrate.ir.bounds).

An index outside [-n, n) is an InputError naming the input (checked on the
host before launch) or the node (an index computed in the model, flagged on
the device); a constant one is refused at fission.  In-range indices,
negative ones included, give onnxruntime's answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import orchestrate
from orchestrate import ir
from orchestrate.errors import InputError
from orchestrate.frontend import onnxrt
from orchestrate.ir.bounds import INDEX_ERROR, index_bounds
from orchestrate.plan.pipeline import fission_model
from orchestrate.run.runtime import Program, load_kernels
from tests.emit_util import one_kernel
from tests.test_cli import assert_user_error, invoke
from tests.util import has_nvidia_backend

N = 7  # rows of the embedding table
W = np.arange(N * 3, dtype=np.float32).reshape(N, 3)


def _model(nodes, inputs, inits, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "m",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _ids(shape=(2, 3), dtype=TensorProto.INT64):
    return helper.make_tensor_value_info("ids", dtype, list(shape))


def embedding() -> onnx.ModelProto:
    """y = W[ids]: the index is a graph input (checked on the host)."""
    return _model([helper.make_node("Gather", ["w", "ids"], ["y"], name="emb")], [_ids()], {"w": W})


def shifted_embedding() -> onnx.ModelProto:
    """y = W[ids + 1]: the index is computed (checked on the device)."""
    nodes = [
        helper.make_node("Add", ["ids", "one"], ["j"], name="plus"),
        helper.make_node("Gather", ["w", "j"], ["y"], name="emb"),
    ]
    return _model(nodes, [_ids()], {"w": W, "one": np.array(1, np.int64)})


def argmax_lookup() -> onnx.ModelProto:
    """y = W[argmax(x, 1)] with 9 columns and 7 rows: argmax may be 7 or 8."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9])
    nodes = [
        helper.make_node("ArgMax", ["x"], ["j"], name="pick", axis=1, keepdims=0),
        helper.make_node("Gather", ["w", "j"], ["y"], name="lookup"),
    ]
    return _model(nodes, [x], {"w": W})


def _optimize(tmp_path_factory, model: onnx.ModelProto, name: str) -> orchestrate.api.Bundle:
    folder = tmp_path_factory.mktemp(name)
    onnx.save(model, folder / "m.onnx")
    orchestrate.optimize(folder / "m.onnx", folder / "out", trials=1)
    return orchestrate.load(folder / "out")


@pytest.fixture(scope="module")
def emb_bundle(tmp_path_factory):
    return _optimize(tmp_path_factory, embedding(), "emb")


def _ort(model, feeds):
    return onnxrt.run(model, feeds)["y"]


def _ort_refuses(model, feeds) -> bool:
    try:
        onnxrt.run(model, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime's own exception types
        return True
    return False


# -- an index that is a graph input: checked on the host --------------------------------


@pytest.mark.parametrize("bad", [N, -N - 1, -5000, 10**12, -(2**63)])
def test_input_index_out_of_range_names_the_input(emb_bundle, bad):
    ids = np.array([[0, 1, 2], [3, bad, 4]], np.int64)
    assert _ort_refuses(embedding(), {"ids": ids})
    with pytest.raises(InputError) as e:
        emb_bundle.run({"ids": ids})
    msg = str(e.value)
    assert f"input 'ids': index {bad} out of range [-{N}, {N})" in msg
    assert "gather node 'emb'" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("edge", [-1, N - 1, -N, 0])
def test_edge_indices_give_onnxruntimes_answer(emb_bundle, edge):
    ids = np.array([[edge, 1, 2], [3, edge, N - 1]], np.int64)
    np.testing.assert_array_equal(
        emb_bundle.run({"ids": ids})["y"], _ort(embedding(), {"ids": ids})
    )


def test_cli_run_exits_2_naming_the_input(emb_bundle, tmp_path):
    for bad in (N, -5000, 10**12):
        f = tmp_path / f"ids{bad}.npy"
        np.save(f, np.full((2, 3), bad, np.int64))
        r = invoke("run", emb_bundle.path, "--input", f"ids={f}", "--output-dir", tmp_path / "o")
        assert_user_error(r, "input 'ids'", f"index {bad} out of range", "'emb'")
        assert not (tmp_path / "o").exists()


# -- an index computed in the model: the device flag ------------------------------------


def test_computed_index_sets_the_device_flag(tmp_path_factory):
    model = shifted_embedding()
    b = _optimize(tmp_path_factory, model, "shifted")
    for bad in (N - 1, -N - 2, -5000, 10**12):
        ids = np.array([[0, 1, 2], [3, bad, 4]], np.int64)
        assert _ort_refuses(model, {"ids": ids})
        with pytest.raises(InputError, match=r"gather node 'emb'.*computed.*\[-7, 7\)"):
            b.run({"ids": ids})
    # the flag is cleared between runs; the wrapped edge -N - 1 + 1 = -N is valid
    ids = np.array([[-N - 1, -1, 0], [1, N - 2, -2]], np.int64)
    np.testing.assert_array_equal(b.run({"ids": ids})["y"], _ort(model, {"ids": ids}))


@pytest.mark.gpu
def test_the_flag_is_read_after_every_cuda_graph_replay(tmp_path_factory):
    """Runs 2 and later replay a CUDA graph: the flag is cleared and read
    around each replay, and an input check still precedes it."""
    model = shifted_embedding()
    b = _optimize(tmp_path_factory, model, "replayed")
    good = np.array([[0, 1, 2], [3, 4, -N - 1]], np.int64)
    bad = np.array([[0, 1, 2], [3, N - 1, 4]], np.int64)
    for _ in range(2):
        np.testing.assert_array_equal(b.run({"ids": good})["y"], _ort(model, {"ids": good}))
        with pytest.raises(InputError, match="gather node 'emb'"):
            b.run({"ids": bad})
    e = _optimize(tmp_path_factory, embedding(), "replayed_input")
    ids = np.zeros((2, 3), np.int64)
    for _ in range(3):
        e.run({"ids": ids})
    ids[1, 1] = 10**12  # segfaulted before the check and the clamp
    with pytest.raises(InputError, match="input 'ids'"):
        e.run({"ids": ids})


def test_argmax_feeding_a_gather_is_checked_on_the_device(tmp_path_factory):
    model = argmax_lookup()
    b = _optimize(tmp_path_factory, model, "argmax")
    x = np.zeros((2, 9), np.float32)
    x[0, 3] = x[1, 6] = 1.0
    np.testing.assert_array_equal(b.run({"x": x})["y"], _ort(model, {"x": x}))
    x[1, 8] = 2.0
    assert _ort_refuses(model, {"x": x})
    with pytest.raises(InputError, match="gather node 'lookup'"):
        b.run({"x": x})


def test_a_narrowing_cast_is_checked_after_the_cast(tmp_path_factory):
    """int64 -> int32 wraps 2**32 + 1 to 1, a valid index: the input is not
    refused for a value the gather never sees."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["j"], name="narrow", to=TensorProto.INT32),
        helper.make_node("Gather", ["w", "j"], ["y"], name="emb"),
    ]
    model = _model(nodes, [_ids()], {"w": W})
    b = _optimize(tmp_path_factory, model, "narrow")
    ids = np.array([[2**32 + 1, 0, 1], [2, 3, -1]], np.int64)
    np.testing.assert_array_equal(b.run({"ids": ids})["y"], _ort(model, {"ids": ids}))
    ids[0, 0] = 2**32 + N
    assert _ort_refuses(model, {"ids": ids})
    with pytest.raises(InputError, match="gather node 'emb'"):
        b.run({"ids": ids})


# -- GatherElements, GatherND, OneHot ------------------------------------------------------


def _gather_op(op: str, idx_shape, **attrs) -> onnx.ModelProto:
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    node = helper.make_node(op, ["x", "ids"], ["y"], name="g", **attrs)
    return _model([node], [_ids(idx_shape)], {"x": x})


@pytest.mark.parametrize(
    "op, shape, attrs, good, bad, where",
    [
        # every coordinate against its own axis (size 3)
        ("GatherElements", (2, 2, 4), {"axis": 1}, [[[0, -3, 2, -1]] * 2] * 2, 3, "input 'ids'"),
        # k = 1, no batch: a Gather of rows (size 2)
        ("GatherND", (3, 1), {}, [[1], [-2], [0]], -3, "input 'ids'"),
        # batch_dims 1, k = 2 over axes of sizes 3 and 4: checked per coordinate
        ("GatherND", (2, 2), {"batch_dims": 1}, [[2, -4], [-1, 3]], 4, "gather node 'g'"),
    ],
)
def test_gather_elements_and_nd(tmp_path_factory, op, shape, attrs, good, bad, where):
    model = _gather_op(op, shape, **attrs)
    b = _optimize(tmp_path_factory, model, op)
    ids = np.array(good, np.int64)
    np.testing.assert_array_equal(b.run({"ids": ids})["y"], _ort(model, {"ids": ids}))
    ids.reshape(-1)[-1] = bad
    assert _ort_refuses(model, {"ids": ids})
    with pytest.raises(InputError, match=where):
        b.run({"ids": ids})


def test_one_hot_out_of_range_is_a_row_of_off_values(tmp_path_factory):
    """ONNX and onnxruntime: no error, as for any index outside [-depth, depth)."""
    node = helper.make_node("OneHot", ["ids", "depth", "values"], ["y"], name="hot")
    model = _model(
        [node],
        [_ids((5,))],
        {"depth": np.array(3, np.int64), "values": np.array([0.5, 2.0], np.float32)},
    )
    b = _optimize(tmp_path_factory, model, "onehot")
    ids = np.array([0, 3, -1, -4, 10**12], np.int64)
    np.testing.assert_array_equal(b.run({"ids": ids})["y"], _ort(model, {"ids": ids}))


# -- constants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [2**40, -N - 1, [[1], [N]]])
def test_a_constant_index_out_of_range_is_refused_at_fission(tmp_path, index):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    nodes = [
        helper.make_node("Gather", ["w", "cidx"], ["g"], name="emb"),
        helper.make_node("Add", ["g", "x"], ["y"], name="add"),
    ]
    model = _model(nodes, [x], {"w": W, "cidx": np.array(index, np.int64)})
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(InputError, match=r"node 'emb' \(Gather\): constant index .* out of range"):
        orchestrate.optimize(tmp_path / "m.onnx", tmp_path / "out", trials=0)
    r = invoke("optimize", tmp_path / "m.onnx", "-o", tmp_path / "out")
    assert_user_error(r, "'emb'", "out of range [-7, 7)")
    assert not (tmp_path / "out").exists()


def test_a_bundles_constant_index_is_checked_when_loaded():
    """A constant the fission check never saw (a hand-made graph, or a
    bundle's edited weights) is refused before anything runs."""
    w = ir.Input("w", ir.TensorType((N, 3), "float32"))
    g = ir.Node(
        ir.Op.GATHER,
        "y",
        ("w", "c"),
        ir.TensorType((2, 3), "float32"),
        ir.Attrs(axis=0),
        origin="emb",
    )
    graph = ir.Graph((g,), (w,), ("y",), {"c": np.array([1, N], np.int64)})
    planned = one_kernel(graph)
    from orchestrate.emit import emit

    module = load_kernels(emit(graph, planned), interpret=True)
    with pytest.raises(InputError, match=r"constant 'c': index 7 out of range \[-7, 7\)"):
        Program(planned, graph, module, interpret=True)


# -- where each index is checked ------------------------------------------------------------


def test_index_preserving_primitives_keep_the_host_check():
    """Through reshape, transpose, expand and a widening cast the input is
    checked on the host; after a slice or an add, on the device."""
    i32 = helper.make_tensor_value_info("ids", TensorProto.INT32, [2, 3])
    nodes = [
        helper.make_node("Cast", ["ids"], ["wide"], to=TensorProto.INT64),
        helper.make_node("Transpose", ["wide"], ["t"], perm=[1, 0]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Gather", ["w", "r"], ["a"], name="host"),
        helper.make_node("Slice", ["ids", "zero", "one", "one"], ["s"]),
        helper.make_node("Gather", ["w", "s"], ["b"], name="device"),
        helper.make_node("Add", ["ids", "ids"], ["twice"]),
        helper.make_node("Gather", ["w", "twice"], ["c"], name="device2"),
        helper.make_node("ReduceSum", ["a"], ["sa"], keepdims=0),
        helper.make_node("ReduceSum", ["b"], ["sb"], keepdims=0),
        helper.make_node("ReduceSum", ["c"], ["sc"], keepdims=0),
        helper.make_node("Sum", ["sa", "sb", "sc"], ["y"]),
    ]
    inits = {
        "w": W,
        "shape": np.array([6], np.int64),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
    }
    graph = fission_model(_model(nodes, [i32], inits), None, "m.onnx")
    where = {b.origin: b.source for b in index_bounds(graph)}
    assert where == {"host": "ids", "device": None, "device2": None}


def test_the_reserved_flag_name_is_refused(tmp_path):
    node = helper.make_node("Gather", ["w", INDEX_ERROR], ["y"], name="emb")
    model = _model(
        [node], [helper.make_tensor_value_info(INDEX_ERROR, TensorProto.INT64, [2])], {"w": W}
    )
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(InputError, match="reserved"):
        orchestrate.optimize(tmp_path / "m.onnx", tmp_path / "out", trials=0)


@pytest.mark.slow
def test_kernels_that_check_on_the_device_compile_for_hopper(tmp_path):
    """The flag store under a matmul prologue's tile mask, in a row
    reduction and in a pointwise kernel, through the real compiler."""
    if not has_nvidia_backend():
        pytest.skip("triton has no NVIDIA backend")
    w2 = np.ones((3, 8), np.float32)
    ids = [_ids()]
    one = {"w": W, "w2": w2, "one": np.array(1, np.int64)}
    shifted = [
        helper.make_node("Add", ["ids", "one"], ["j"]),
        helper.make_node("Gather", ["w", "j"], ["g"], name="emb"),
    ]
    models = {
        "matmul": _model([*shifted, helper.make_node("MatMul", ["g", "w2"], ["y"])], ids, one),
        "softmax": _model([*shifted, helper.make_node("Softmax", ["g"], ["y"])], ids, one),
        "argmax": argmax_lookup(),
        "pointwise": shifted_embedding(),
    }
    bundles = []
    for name, model in models.items():
        onnx.save(model, tmp_path / f"{name}.onnx")
        out = orchestrate.optimize(tmp_path / f"{name}.onnx", tmp_path / name, trials=0)
        assert "err_ptr" in (out.path / "kernels.py").read_text(), name
        bundles.append(str(out.path))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "orchestrate.check.compile_check", *bundles],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:] + run.stdout[-2000:]
    assert run.stdout.count("compile for sm_90") == len(models)
