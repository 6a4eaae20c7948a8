"""``plan/admit.range_admit``: a kernel at OPT checked at the range's ends,
each answer worked out once per graph and kernel."""

from __future__ import annotations

from dataclasses import replace

from orchestrate.cost.devices import get_device
from orchestrate.kernels.spec import KernelSpec, Rejection, Target
from orchestrate.plan import admit as admit_module
from orchestrate.templates import match_all
from tests import graphs

DEVICE = get_device("h100")


def _softmax_at(columns: int):
    return graphs.build(graphs.softmax, [(4, columns)])


def _counted(monkeypatch) -> list[int]:
    calls = [0]
    inner = admit_module.match_all

    def counting(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    monkeypatch.setattr(admit_module, "match_all", counting)
    return calls


def test_an_answer_is_worked_out_once_per_graph_and_kernel(monkeypatch):
    g_opt, g_max = _softmax_at(64), _softmax_at(4096)
    target = Target(DEVICE)
    names = [n.name for n in g_opt.nodes]
    spec = next(k for k in match_all(g_opt, names, target) if isinstance(k, KernelSpec))
    calls = _counted(monkeypatch)
    admit = admit_module.range_admit({"seq=4096": g_max}, target)
    first = admit(g_opt, spec)
    asked = calls[0]
    assert asked > 0
    again = admit(g_opt, replace(spec))  # an equal kernel: the answer kept
    assert again == first and calls[0] == asked
    other = _softmax_at(64)  # another graph, equal or not, is asked again
    assert admit(other, spec) == first and calls[0] > asked
    fresh = admit_module.range_admit({"seq=4096": g_max}, target)(g_opt, spec)
    assert fresh == first


def test_a_kernel_that_cannot_serve_the_range_is_refused_each_time():
    g_opt, g_min = _softmax_at(64), _softmax_at(0)
    target = Target(DEVICE)
    names = [n.name for n in g_opt.nodes]
    spec = next(k for k in match_all(g_opt, names, target) if isinstance(k, KernelSpec))
    admit = admit_module.range_admit({"seq=0": g_min}, target)
    first, again = admit(g_opt, spec), admit(g_opt, spec)
    assert isinstance(first, Rejection) and "not at seq=0" in first.reason
    assert again == first
