"""What one GPU run measures, and in what order.

The fixed scope: BERT-base (sequence 128), GPT-2 small, the Llama-style
decoder (four layers at width 2048), one decoding step of that decoder with
a key/value cache of 512 tokens, and ResNet-50, at fp16, batch 1, each
optimized by orchestrate and timed against torch eager, ``torch.compile``
and ``torch.compile(mode="max-autotune")``.  Breadth first: the bundle and
eager for every model (the table's first columns), then torch.compile for
every model, then max-autotune, so that a run cut short has lost the least
useful figures.  The dry run (``--dry-run``) takes the same steps over the
tiny variants on a CPU: the bundle in Triton's interpreter, eager for
every model, torch.compile and max-autotune for one.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrate.bench.runtimes import ORCHESTRATE, TORCH_COMPILE, TORCH_EAGER, TORCH_MAX_AUTOTUNE


@dataclass(frozen=True)
class Model:
    name: str  # an examples.EXAMPLES name
    size: str  # its size on the GPU (the dry run takes "tiny")
    label: str
    late: tuple[str, ...] = ()  # its runtimes that run only in what the budget leaves


FIXED = (
    Model("bert", "base", "BERT-base, sequence 128"),
    Model("gpt2", "base", "GPT-2 small, sequence 128"),
    Model("llama", "wide", "Llama-style decoder, 4 layers at width 2048, sequence 128"),
    # torch.compile of the decode step runs first in what the required steps
    # leave: the five models' compiles together would not fit the budget
    Model("decode", "wide", "its decode step: 1 token, a key/value cache of 512", (TORCH_COMPILE,)),
    Model("resnet50", "base", "ResNet-50, 224 x 224"),
)
DTYPE = "fp16"
BATCH = 1  # every model of the suite is exported at batch 1
# (runtimes, optional): an optional phase runs in what the budget leaves
PHASES = (
    ((ORCHESTRATE, TORCH_EAGER), False),
    ((TORCH_COMPILE,), False),
    ((TORCH_MAX_AUTOTUNE,), True),
)
# the dry run proves torch.compile once: one model, both modes
DRY_COMPILED = ("bert",)


@dataclass(frozen=True)
class Step:
    model: str
    runtime: str
    optional: bool  # run only where the budget leaves time for it


def steps(models: tuple[Model, ...], dry: bool) -> list[Step]:
    """Every (model, runtime) of a run, in the order it runs: the required
    phases, then each model's ``late`` runtimes, then the optional phase."""
    out = []
    for runtimes, optional in PHASES:
        if optional:
            out += [Step(m.name, rt, True) for m in models for rt in m.late if not dry]
        for m in models:
            for rt in runtimes:
                if dry and rt in (TORCH_COMPILE, TORCH_MAX_AUTOTUNE) and m.name not in DRY_COMPILED:
                    continue
                if rt not in m.late:
                    out.append(Step(m.name, rt, optional))
    return out


def select(only: list[str] | None) -> tuple[Model, ...]:
    """The fixed scope, or the part of it ``only`` names (ValueError naming
    an unknown one)."""
    if not only:
        return FIXED
    known = {m.name: m for m in FIXED}
    for name in only:
        if name not in known:
            raise ValueError(f"--only {name}: not in the fixed scope ({', '.join(known)})")
    return tuple(m for m in FIXED if m.name in only)
