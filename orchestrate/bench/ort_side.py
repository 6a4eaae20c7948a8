"""onnxruntime baselines: the CUDA provider as its users tune it, and the CPU provider.

CUDA: the model (under ``--dtype fp16``, converted by onnxruntime's own
float16 converter, inputs and outputs kept float32 as the bundle keeps them;
for a known transformer type first through onnxruntime's transformer
optimizer, whose fusions are its attention, LayerNorm and GELU kernels),
all graph optimisations on, inputs and outputs bound on the GPU (IO binding,
to torch tensors whose addresses never change), and the provider's CUDA
graph (``enable_cuda_graph``); each call copies its input set into the
bound inputs on the GPU and runs.  Where the CUDA provider is not there it
is ``Unavailable`` with the reason: never silently the CPU provider.
``bf16`` has no onnxruntime converter: unavailable.

onnxruntime's memory is its own CUDA arena: torch's allocator does not see
it, so its peak memory is not reported (the reason says so).

CPU: ``session.run`` on numpy inputs, with the same fp16 conversion.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import onnx

from orchestrate.bench.runtimes import ORT_CPU, ORT_CUDA, Feeds, Ready, Unavailable
from orchestrate.bench.torch_side import _first_line
from orchestrate.frontend import onnxrt
from orchestrate.frontend.onnxrt import MAX_IR_VERSION

ORT_MEMORY = "onnxruntime allocates from its own CUDA arena, which torch.cuda cannot see"
# orchestrate example / suite names -> onnxruntime.transformers model_type
TRANSFORMER_TYPES = {"bert": "bert", "gpt2": "gpt2", "vit": "vit"}


def cuda_refusal(on_gpu: bool) -> str | None:
    """Why onnxruntime's CUDA provider cannot run here, or None."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if not on_gpu:
        return "no CUDA GPU on this machine"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (
            f"onnxruntime {ort.__version__} here is the CPU build (providers: "
            f"{', '.join(ort.get_available_providers())}); onnxruntime-gpu is not installed"
        )
    return None


def prepared(model: onnx.ModelProto, dtype: str | None, model_type, use_gpu: bool):
    """(the model onnxruntime runs, what was done to it).  ``model_type`` is an
    onnxruntime.transformers type, or (type, heads, hidden) to name its sizes."""
    notes = []
    if model_type is not None:
        kind, heads, hidden = model_type if isinstance(model_type, tuple) else (model_type, 0, 0)
        try:
            from onnxruntime.transformers.optimizer import optimize_model

            opt = optimize_model(
                model,
                model_type=kind,
                num_heads=heads,
                hidden_size=hidden,
                use_gpu=use_gpu,
                opt_level=0,
            )
            fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
            model = opt.model
            if fused and not any(o.domain == "com.microsoft" for o in model.opset_import):
                model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
            notes.append(
                f"transformer fusions ({kind}): "
                + (", ".join(f"{k} {v}" for k, v in sorted(fused.items())) or "none")
            )
        except Exception as e:  # noqa: BLE001 - the optimizer's failure is a note, not an end
            notes.append(f"transformer optimizer failed ({_first_line(e)}); plain model")
    if dtype == "fp16":
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(model, keep_io_types=True)
        notes.append("converted to fp16 by onnxruntime.transformers.float16, float32 I/O")
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
    return model, notes


def ort_runtime(
    key: str,
    model: onnx.ModelProto,
    feed_sets: Sequence[Feeds],
    dtype: str | None,
    model_type,
    on_gpu: bool,
) -> Ready | Unavailable:
    started = time.perf_counter()
    if key == ORT_CUDA:
        refusal = cuda_refusal(on_gpu)
        if refusal is not None:
            return Unavailable(key, refusal)
    if dtype == "bf16":
        return Unavailable(
            key, "onnxruntime has no bf16 converter (its float16 tool makes fp16 only)"
        )
    try:
        import onnxruntime as ort

        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        ready_model, notes = prepared(copy, dtype, model_type, key == ORT_CUDA)

        def opts():
            o = ort.SessionOptions()
            o.log_severity_level = 3
            o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            return o

        if key == ORT_CPU:
            session = onnxrt.session(ready_model, ["CPUExecutionProvider"], opts())
            names = [o.name for o in session.get_outputs()]

            def call(i: int):
                return session.run(names, dict(feed_sets[i]))

            call(0)
            return Ready(
                key, "onnxruntime (CPU)", call, time.perf_counter() - started, note="; ".join(notes)
            )
        call, graph_note = _cuda_call(ort, ready_model, opts, feed_sets)
    except Exception as e:  # noqa: BLE001 - any failure of the baseline is its reason
        return Unavailable(key, f"onnxruntime failed: {_first_line(e)}")
    return Ready(
        key,
        "onnxruntime (CUDA)",
        call,
        time.perf_counter() - started,
        memory_note=ORT_MEMORY,
        note="; ".join(notes + [graph_note]),
    )


def _cuda_call(ort, model: onnx.ModelProto, opts, feed_sets: Sequence[Feeds]):
    """A call of input set i through IO binding, with the provider's CUDA
    graph where it captures (else without, and the note says so); ``opts()``
    makes each session's options."""
    import torch

    last = None
    for graph in (True, False):
        try:
            provider = ("CUDAExecutionProvider", {"enable_cuda_graph": "1" if graph else "0"})
            session = onnxrt.session(model, [provider], opts())
            if session.get_providers()[0] != "CUDAExecutionProvider":
                raise RuntimeError("the session fell back to " + session.get_providers()[0])
            staged = [{k: torch.from_numpy(v).cuda() for k, v in f.items()} for f in feed_sets]
            bound = {k: v.clone() for k, v in staged[0].items()}
            binding = session.io_binding()
            for k, t in bound.items():
                binding.bind_input(k, "cuda", 0, _np_dtype(t), tuple(t.shape), t.data_ptr())
            outputs = {}
            for o in session.get_outputs():
                t = torch.empty(_shape(o), dtype=_torch_dtype(torch, o.type), device="cuda")
                outputs[o.name] = t
                binding.bind_output(o.name, "cuda", 0, _np_dtype(t), tuple(t.shape), t.data_ptr())

            def call(i: int, session=session, binding=binding, bound=bound, staged=staged):
                for k, t in bound.items():
                    t.copy_(staged[i][k])
                session.run_with_iobinding(binding)

            call(0)
            call(1 % len(feed_sets))  # the CUDA graph is captured on an early run
            torch.cuda.synchronize()
            return (
                call,
                "IO binding, CUDA graph" if graph else f"IO binding, no CUDA graph ({last})",
            )
        except Exception as e:  # noqa: BLE001 - try again without the CUDA graph
            if not graph:
                raise
            last = f"CUDA graph failed: {_first_line(e)}"
    raise AssertionError("unreachable")


def _shape(output) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in output.shape):
        raise ValueError(f"output {output.name!r} has a symbolic shape {output.shape}")
    return tuple(output.shape)


_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(bool)": "bool",
    "tensor(double)": "float64",
}


def _torch_dtype(torch, ort_type: str):
    return getattr(torch, _TYPES[ort_type])


def _np_dtype(t) -> type:
    return np.dtype(str(t.dtype).removeprefix("torch.")).type
