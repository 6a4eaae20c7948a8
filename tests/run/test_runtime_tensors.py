"""Torch tensors in, torch tensors out: the same checks, no copy through the host.

Without a GPU the tensors are CPU tensors and the kernels run in the
interpreter; the `gpu` tier runs the same calls with CUDA tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrate.emit import emit
from orchestrate.errors import InputError
from orchestrate.plan.pipeline import fission_model
from orchestrate.run.runtime import Program, load_kernels
from tests import graphs
from tests.emit_util import one_kernel, plan_from_sets
from tests.ir.test_index_bounds import N, embedding, shifted_embedding


def _program(graph, planned) -> Program:
    return Program(planned, graph, load_kernels(emit(graph, planned), True), interpret=True)


def _chain(b, x, y):
    t = b.tanh(b.add(x, y))
    t = b.mul(b.add(t, 1.0), x)
    # outputs: a view of a buffer, a buffer, a view of an input
    return b.reshape(t, (x.shape[1], x.shape[0])), b.tanh(t), b.reshape(y, (60,))


@pytest.fixture(scope="module")
def chain():
    g = graphs.build(_chain, [(6, 10), (6, 10)])
    planned = plan_from_sets(g, [[n.name] for n in g.nodes])
    assert [k.template for k in planned.plan.kernels].count("view") == 2
    program = _program(g, planned)
    assert len(program._input_views) == 1  # the view of an input, made at each run
    return g, program


def test_tensors_in_give_tensors_out_equal_to_the_numpy_path(chain):
    g, program = chain
    feeds = graphs.random_inputs(g)
    want = program.run(feeds)
    tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}
    got = program.run(tensors)
    assert set(got) == set(want) == set(g.outputs)
    for name, t in got.items():
        assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
        np.testing.assert_array_equal(t.numpy(), want[name])
    # the outputs are the caller's: the next run writes its own, and an
    # output that is a view of an input is not the input
    assert got["g/reshape_2"].data_ptr() != tensors["x1"].data_ptr()
    kept = {k: t.clone() for k, t in got.items()}
    program.run({k: t + 1 for k, t in tensors.items()})
    for name, t in got.items():
        assert torch.equal(t, kept[name])
    # and the numpy path still gives its own arrays
    again = program.run(feeds)
    for name, a in again.items():
        np.testing.assert_array_equal(a, want[name])


def test_a_non_contiguous_tensor_is_read_as_its_values(chain):
    g, program = chain
    feeds = graphs.random_inputs(g)
    x = torch.from_numpy(np.ascontiguousarray(feeds["x0"].T)).T  # a transposed view
    assert not x.is_contiguous()
    got = program.run({"x0": x, "x1": torch.from_numpy(feeds["x1"])})
    for name, a in program.run(feeds).items():
        np.testing.assert_array_equal(got[name].numpy(), a)


@pytest.mark.parametrize(
    "feeds, message",
    [
        (
            {"x0": torch.zeros(10, 6), "x1": torch.zeros(6, 10)},
            r"^input 'x0': shape \[10, 6\], expected \[6, 10\]$",
        ),
        (
            {"x0": torch.zeros(6, 10, dtype=torch.float64), "x1": torch.zeros(6, 10)},
            r"^input 'x0': dtype float64, expected float32$",
        ),
        ({"x0": torch.zeros(6, 10)}, r"^missing input 'x1'"),
        (
            {"x0": torch.zeros(6, 10), "x1": torch.zeros(6, 10), "z": torch.zeros(1)},
            r"^unknown input 'z'",
        ),
        (
            {"x0": torch.zeros(6, 10), "x1": np.zeros((6, 10), np.float32)},
            r"^input 'x1': a ndarray among torch tensors",
        ),
        (
            {"x0": torch.zeros(6, 10), "x1": torch.zeros(6, 10, device="meta")},
            r"^input 'x1': a tensor on meta, expected one on cpu",
        ),
    ],
)
def test_a_bad_tensor_is_an_input_error_naming_it(chain, feeds, message):
    _, program = chain
    with pytest.raises(InputError, match=message) as e:
        program.run(feeds)
    assert "\n" not in str(e.value)


def test_gather_indices_in_a_tensor_are_checked_before_the_run():
    g = fission_model(embedding(), None, "m")
    program = _program(g, one_kernel(g))
    ids = torch.tensor([[0, 1, 2], [3, -N, N - 1]])
    got = program.run({"ids": ids})["y"]
    np.testing.assert_array_equal(got.numpy(), program.run({"ids": ids.numpy()})["y"])
    ids[1, 1] = N
    with pytest.raises(InputError, match=r"^input 'ids': index 7 out of range \[-7, 7\)"):
        program.run({"ids": ids})
    ids[1, 1] = -N - 1
    with pytest.raises(InputError, match="input 'ids'"):
        program.run({"ids": ids})


def test_a_computed_index_from_a_tensor_is_flagged_on_the_device():
    g = fission_model(shifted_embedding(), None, "m")
    program = _program(g, one_kernel(g))
    assert program._flag_of, "the index is checked on the device"
    ids = torch.tensor([[0, 1, 2], [3, 4, -N - 1]])
    program.run({"ids": ids})
    ids[1, 1] = N - 1
    with pytest.raises(InputError, match=r"gather node 'emb'.*computed.*\[-7, 7\)"):
        program.run({"ids": ids})


def test_every_kernel_is_bound_once():
    """Made, the program has one step per launched kernel and every buffer;
    a run only binds the inputs (the liveness test counts the buffers)."""
    g = graphs.build(lambda b, x: b.tanh(b.add(b.tanh(x), 1.0)), [(4, 5)])
    planned = plan_from_sets(g, [[n.name] for n in g.nodes])
    program = _program(g, planned)
    assert len(program._steps) == len(planned.plan.kernels) == 3
    assert [v is None for v in program._fixed].count(True) == len(g.inputs)


@pytest.mark.gpu
def test_cuda_tensors_through_a_replayed_cuda_graph():
    """Run 1 compiles, run 2 captures, run 3 replays: CUDA tensors in and
    out each time, equal to the numpy path; the index check still fires."""
    g = graphs.build(_chain, [(6, 10), (6, 10)])
    planned = plan_from_sets(g, [[n.name] for n in g.nodes])
    program = Program(planned, g, load_kernels(emit(g, planned), False), interpret=False)
    assert program.use_cuda_graph, "the CUDA graph is on by default on a GPU"
    for seed in range(3):
        feeds = graphs.random_inputs(g, seed)
        got = program.run({k: torch.from_numpy(v).cuda() for k, v in feeds.items()})
        want = program.run(feeds)
        for name, t in got.items():
            assert t.is_cuda
            np.testing.assert_allclose(t.cpu().numpy(), want[name], rtol=1e-6)
    assert program._graph is not None
    e = fission_model(embedding(), None, "m")
    lookup = Program(one_kernel(e), e, load_kernels(emit(e, one_kernel(e)), False), interpret=False)
    ids = torch.zeros((2, 3), dtype=torch.int64, device="cuda")
    for _ in range(3):
        lookup.run({"ids": ids})
    ids[1, 1] = N
    with pytest.raises(InputError, match="input 'ids'"):
        lookup.run({"ids": ids})
