"""The cost model prices configurations as a GPU runs them, and the rules
take the model's best configuration (kernels/config.py, cost/roofline.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrate.cost import figures, roofline
from orchestrate.cost.devices import get_device
from orchestrate.explain import kernel_table
from orchestrate.kernels import config
from orchestrate.kernels.region import region
from orchestrate.kernels.rule import ranked
from orchestrate.kernels.spec import MATMUL, Anchored, KernelSpec, Target, split_k
from orchestrate.plan.planner import PlanOptions, plan
from orchestrate.templates import template
from tests import graphs

H200 = get_device("h200")


def _gemm(m, n, k, dtype="float16"):
    return graphs.build(lambda b, x, w: b.matmul(x, w), [(m, k), (k, n)], dtype=dtype)


def _ranked(g, device=H200, tf32=False, sms=0) -> list[KernelSpec]:
    """Every fitting configuration of the graph's one matmul, best first
    (with split-K when ``sms`` says how many SMs the tiles must fill)."""
    (mm,) = g.nodes
    m, n = mm.shape
    configs = config.matmul(m, n, g.types[mm.inputs[0]].shape[-1], mm.dtype, tf32, 1, sms)
    target = Target(device, tf32, rank=roofline.Ranker(device))
    r = region(g, [mm.name])
    out = ranked(
        g, template(MATMUL).rule, r, mm.shape, Anchored(mm.name, (), ()), (), configs, target
    )
    assert isinstance(out, list)
    return out


def test_a_small_gemm_is_not_free():
    """A 128 x 768 x 768 fp16 GEMM (BERT-base's projections): its bandwidth
    and tensor-core floors are 0.33 and 0.15 us on an H200, but its best
    tiling gets a few dozen of the 132 SMs and a chain of K steps: the model
    prices it at microseconds."""
    g = _gemm(128, 768, 768)
    k = plan(g, PlanOptions(device="h200")).plan.kernels[0]
    floor = max(k.bytes / (H200.bandwidth_gbs * 1e3), k.flops / (H200.fp16_tflops * 1e6))
    assert floor < 0.5
    assert k.predicted_us > 3 * floor + figures.LAUNCH_US


def test_the_plan_takes_the_models_best_configuration():
    g = _gemm(512, 1024, 2048)
    best = _ranked(g)
    times = [roofline.cost(g, s, H200).time_us for s in best]
    assert times == sorted(times) and len(set(times)) > 1
    k = plan(g, PlanOptions(device="h200")).plan.kernels[0]
    assert k.config == best[0].config
    assert k.predicted_us == pytest.approx(times[0], abs=1e-3)


def test_wave_quantisation():
    """One tile more than the SMs hold costs a second wave of compute."""
    s = _ranked(_gemm(64 * 133, 64, 4096))  # 133 tiles of 64 x 64
    one = [c for c in s if (c.config["BLOCK_M"], c.config["BLOCK_N"]) == (64, 64)][0]
    c = roofline.cost(_gemm(64 * 133, 64, 4096), one, H200)
    assert c.blocks == 133
    dots = 2 * 64 * 133 * 64 * 4096
    rate = H200.fp16_tflops * figures.TENSOR_CORE_EFFICIENCY * 1e6
    assert c.compute_us == pytest.approx(dots / rate * 132 * 2 / 133)


@pytest.mark.parametrize(
    "dtype, tf32, rate",
    [
        ("float16", False, H200.fp16_tflops * figures.TENSOR_CORE_EFFICIENCY),
        ("float32", True, H200.tf32_tflops * figures.TENSOR_CORE_EFFICIENCY),
        ("float32", False, H200.fp32_tflops * figures.FP32_DOT_EFFICIENCY),
    ],
)
def test_tensor_core_and_cuda_core_rates(dtype, tf32, rate):
    g = _gemm(4096, 4096, 4096, dtype)
    s = _ranked(g, tf32=tf32)[0]
    c = roofline.cost(g, s, H200)
    blocks = c.blocks
    quantised = 132 * math.ceil(blocks / 132) / blocks
    assert c.compute_us == pytest.approx(2 * 4096**3 / (rate * 1e6) * quantised)
    assert c.compute_us > c.memory_us  # a large GEMM is compute-bound


def test_a_prologue_adds_cuda_core_time_per_column_of_tiles():
    """A GELU (with erf) folded into a matmul's A operand runs on CUDA cores
    once per column of BLOCK_N tiles, between the tensor-core steps."""

    def fn(b, x, w):
        return b.matmul(b.erf(x), w)

    g = graphs.build(fn, [(128, 3072), (3072, 768)], dtype="float16")
    k = plan(g, PlanOptions(device="h200"))
    fused = [s for s in k.specs if len(s.nodes) > 1]
    if not fused:
        pytest.skip("the plan does not fold the erf into the matmul")
    s = fused[0]
    dots, other = roofline.split_flops(g, s)
    fix_up = split_k(s.config) * 128 * 768  # split-K: the last program adds the partials
    assert other == 128 * 3072 * figures.SFU_FLOPS * math.ceil(768 / s.config["BLOCK_N"]) + fix_up


def test_latency_floor_counts_k_steps_and_stages():
    g = _gemm(64, 64, 8192)
    specs = _ranked(g)
    for s in specs:
        c = roofline.cost(g, s, H200)
        steps = math.ceil(8192 / s.config["BLOCK_K"])
        ahead = max(1, s.config.num_stages - 1)
        assert c.latency_us == pytest.approx(figures.DRAM_LATENCY_US * (1 + steps / ahead))


def test_every_figure_states_its_source():
    """Each figure in cost/figures.py has a comment above it."""
    text = Path(figures.__file__).read_text().splitlines()
    for i, line in enumerate(text):
        if line and line[0].isupper() and " = " in line:
            assert text[i - 1].startswith("#"), f"{line.split(' =')[0]} has no stated source"


def test_split_k_pays_for_a_skinny_long_k_gemm():
    """BERT-base's FFN down-projection, 128 x 768 x 3072 in fp16 on an H200.
    Unsplit, the best tiling (64 x 64 x 128, 4 stages) is 24 blocks on 132
    SMs walking 24 K steps: latency 0.6 x (1 + 24 / 3) = 5.4 us, + 1 launch.
    Split 8 ways with 32 x 32 x 128 tiles (3 stages): 4 x 24 x 8 = 768
    blocks of 3 K steps, 7 resident per SM (32 KB of shared memory each), so
    one wave; latency 0.6 x (1 + 3 / 2) + 2 x 0.6 for the fix-up = 2.7 us.
    Bytes: A 786,432 + B 4,718,592 + C 196,608 = 5,701,632, plus the fp32
    partials written and read, 2 x 8 x 128 x 768 x 4 = 6,291,456; the busy
    SMs keep 6 x 4,949 B each in flight (one block's two pipelined steps of
    5,701,632 / 768 / 3 B), 132 x 29,696 / 0.6 > 4.32 MB/us, so memory takes
    11,993,088 B at 0.9 x 4.8 TB/s = 2.776 us: the split kernel is 3.776 us."""
    g = _gemm(128, 768, 3072)
    best = _ranked(g, sms=H200.sms)
    first, c = best[0], roofline.cost(g, best[0], H200)
    tile = tuple(first.config[b] for b in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K"))
    assert tile == (32, 32, 128, 8) and (first.config.num_stages, c.blocks) == (3, 768)
    assert c.latency_us == pytest.approx(0.6 * (1 + 3 / 2) + 2 * 0.6)
    assert c.memory_us == pytest.approx(11_993_088 / (4800e3 * 0.9))
    assert c.time_us == pytest.approx(11_993_088 / (4800e3 * 0.9) + 1.0)
    unsplit = next(s for s in best if split_k(s.config) == 1)
    assert roofline.cost(g, unsplit, H200).time_us == pytest.approx(0.6 * (1 + 24 / 3) + 1.0)
    # the planner takes it; plan.json records SPLIT_K and explain prints it as k8
    result = plan(g, PlanOptions(device="h200")).plan
    (k,) = result.kernels
    assert k.config.to_json()["SPLIT_K"] == 8
    assert "32x32x128 w4 s3 k8" in kernel_table(result)


def test_split_k_does_not_pay_where_the_tiles_fill_the_gpu():
    """4096 x 4096 x 4096: 1,024 tiles of 128 x 128 already fill 132 SMs
    seven times over; no configuration splits K."""
    g = _gemm(4096, 4096, 4096)
    assert all(split_k(s.config) == 1 for s in _ranked(g, sms=H200.sms))
    (k,) = plan(g, PlanOptions(device="h200")).plan.kernels
    assert "SPLIT_K" not in k.config.to_json()
    # 512 x 768 x 3072: 96 tiles of 64 x 64 underfill the GPU and splitting
    # is offered, but two waves of split blocks cost more than they save
    g = _gemm(512, 768, 3072)
    best = _ranked(g, sms=H200.sms)
    assert any(split_k(s.config) > 1 for s in best) and split_k(best[0].config) == 1
