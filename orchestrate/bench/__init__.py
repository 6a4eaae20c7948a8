"""`orchestrate bench`: the bundle side by side with what users run today.

    runtimes.py    the bundle, and what a runtime is (ready, or unavailable and why)
    torch_side.py  torch eager and torch.compile (default, max-autotune), via onnx2torch
    ort_side.py    onnxruntime: CUDA provider (IO binding, CUDA graph, fusions), CPU
    clock.py       one clock for all (CUDA events on a GPU), warm-up, inputs rotated, memory
    stats.py       median, p10, p90
    floor.py       the roofline floor: least bytes / bandwidth, flops / peak
    run.py         one model: every runtime in turn
    report.py      table, JSON (and its schema check), PNG chart

Without a GPU the bundle runs in Triton's interpreter and every baseline on
the CPU: the figures prove the harness works and say nothing about GPU speed.
"""
