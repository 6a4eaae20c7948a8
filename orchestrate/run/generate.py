"""Decoding tokens with a decode-step bundle: greedy, or sampled with a seed.

A decode step's interface (``frontend/decode.py``): ``input_ids`` [1, 1],
``attention_mask`` [1, past + 1], ``past*`` caches returned grown as
``present*``, and the logits. The bundle must be made for a range of past
lengths (``--dim past=1..N``), one kernels.py for every step. Below the
range's least past length the cache is padded with masked slots (zeros the
attention mask hides), so the prompt's first token can be fed to a bundle
whose range starts at 1; a model that reads positions from the mask (as the
examples and Hugging Face's ``generate`` do) is not moved by them. With a
prefill bundle (``examples/decode.py``'s prefill step, the past length the
decode range's least) the prompt runs in one step; without one it is fed a
token per step.

The caches between steps are one of two kinds, both run by ``generate``:

* ``InPlaceCaches`` (the bundle's ``in_place/`` step): one buffer per cache
  of the range's MAX + 1 rows, allocated once on the step's device; the step
  reads the first ``past`` rows where they are and returns only the new row,
  which is written at row ``past``: one row per cache per step.
* ``GrownCaches`` (the graph's own step): the ``present*`` outputs are the
  next step's ``past*`` inputs, the whole cache written every step.

``Generated.cache_bytes`` counts the cache bytes each step stores for the
next one (the rows written in place, or the whole ``present*`` taken).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from orchestrate.errors import InputError
from orchestrate.frontend.decode import DecodeIO

Step = Callable[[Mapping[str, object]], Mapping[str, object]]


@dataclass
class GrownCaches:
    """Caches the step grows by its own concat: ``present*`` fed back."""

    io: DecodeIO
    caches: dict[str, torch.Tensor]  # by past input, at the current past length

    def feed(self, past: int) -> dict[str, torch.Tensor]:
        return dict(self.caches)

    def slots(self, past: int) -> int:
        """The past length the step runs at: the cache's own."""
        return past

    def update(self, result: Mapping[str, torch.Tensor], past: int) -> int:
        self.caches = {p: result[present] for p, present in self.io.caches}
        return sum(t.nbytes for t in self.caches.values())

    def first(self, rows: int) -> dict[str, torch.Tensor]:
        """The caches' first ``rows`` rows (all of them, before a prefill)."""
        return dict(self.caches)

    def load(self, result: Mapping[str, torch.Tensor]) -> int:
        """Take a prefill's ``present*`` as the caches; the bytes stored."""
        return self.update(result, 0)


@dataclass
class InPlaceCaches:
    """Buffers of a capacity of rows, the new row written at ``past``."""

    io: DecodeIO
    buffers: dict[str, torch.Tensor]  # by past input, ``capacity`` rows on its axis
    axes: dict[str, int]
    bucket: int = 1  # past lengths are rounded up to a multiple of it
    most: int | None = None  # the range's greatest past length

    def feed(self, past: int) -> dict[str, torch.Tensor]:
        return dict(self.buffers)

    def slots(self, past: int) -> int:
        """The past length the step runs at: ``past`` rounded up to the
        bucket (the slots between masked), so the steps of a bucket share one
        binding, one Program and, on a GPU, one CUDA graph."""
        rounded = -(-past // self.bucket) * self.bucket
        return rounded if self.most is None else min(rounded, max(self.most, past))

    def update(self, result: Mapping[str, torch.Tensor], past: int) -> int:
        written = 0
        for p, present in self.io.caches:
            row = result[present]
            self.buffers[p].narrow(self.axes[p], past, 1).copy_(row)
            written += row.nbytes
        return written

    def first(self, rows: int) -> dict[str, torch.Tensor]:
        """Each buffer's first ``rows`` rows (what a prefill reads)."""
        return {p: b.narrow(self.axes[p], 0, rows) for p, b in self.buffers.items()}

    def load(self, result: Mapping[str, torch.Tensor]) -> int:
        """A prefill's ``present*`` written into the buffers' first rows; the
        bytes stored."""
        written = 0
        for p, present in self.io.caches:
            grown = result[present]
            self.buffers[p].narrow(self.axes[p], 0, grown.shape[self.axes[p]]).copy_(grown)
            written += grown.nbytes
        return written


def caches_for(
    io: DecodeIO,
    shapes: Mapping[str, tuple[tuple[int, ...], int, str]],
    rows: int | None,
    least_past: int,
    device: str,
    bucket: int = 1,
    most: int | None = None,
) -> GrownCaches | InPlaceCaches:
    """Zeroed caches: per cache input, (its shape, the axis that grows, its
    dtype) (the length on that axis is ignored); buffers of ``rows`` rows
    kept in place (past lengths rounded up to ``bucket``, at most ``most``),
    or (``rows`` None) grown caches of ``least_past`` rows."""
    made = {}
    for name, (shape, axis, dtype) in shapes.items():
        shape = list(shape)
        shape[axis] = least_past if rows is None else rows
        made[name] = torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
    if rows is None:
        return GrownCaches(io, made)
    axes = {name: axis for name, (_, axis, _) in shapes.items()}
    return InPlaceCaches(io, made, axes, bucket, most)


@dataclass(frozen=True)
class Generated:
    tokens: tuple[int, ...]  # the new tokens, after the prompt
    steps: int  # steps run (the prompt's included)
    seconds: float  # wall clock of the steps
    cache_bytes: tuple[int, ...] = field(default=())  # per step, the cache stored for the next
    in_place: bool = False  # whether the caches were kept in place

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("inf")


def choose(logits: np.ndarray, rng: np.random.Generator | None, temperature: float) -> int:
    """The next token: the argmax, or a draw from softmax(logits / temperature)."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1, logits.shape[-1])[-1]
    if rng is None:
        return int(np.argmax(row))
    z = row / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def generate(
    step: Step,
    io: DecodeIO,
    caches: GrownCaches | InPlaceCaches,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    least_past: int = 0,
    most_past: int | None = None,
    sample: bool = False,
    seed: int = 0,
    temperature: float = 1.0,
    prefill: Step | None = None,
) -> Generated:
    """Decode ``max_new_tokens`` after ``prompt`` with ``step`` over
    ``caches`` (``caches_for``), which start with ``least_past`` masked slots;
    a step beyond ``most_past`` is refused. ``prefill``: a step over the whole
    prompt at once after those slots (``examples/decode.py``'s prefill step),
    whose ``present*`` the decode steps continue from; else the prompt is fed
    a token a step."""
    if not prompt:
        raise InputError("--prompt-ids: give at least one token")
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: expected at least 1")
    if any(t < 0 for t in prompt):  # (past the vocabulary: the step's gather refuses it)
        raise InputError(f"--prompt-ids: token {min(prompt)} is negative")
    if sample and not temperature > 0:
        raise InputError(f"--temperature {temperature}: expected more than 0")
    steps = len(prompt) + max_new_tokens - 1  # token by token
    last = least_past + steps - 1  # the past length of the last step
    if most_past is not None and last > most_past:
        raise InputError(
            f"{len(prompt)} prompt and {max_new_tokens} new tokens need a past of {last}; "
            f"the bundle's range ends at {most_past}"
        )
    device = next(iter(caches.feed(least_past).values())).device
    cached = torch.zeros((1, least_past + steps), dtype=torch.int64, device=device)
    rng = np.random.default_rng(seed) if sample else None
    out: list[int] = []
    stored: list[int] = []
    token, begin, calls = prompt[0], 0, 0
    start = time.perf_counter()
    if prefill is not None:
        n = len(prompt)
        mask = torch.zeros((1, least_past + n), dtype=torch.int64, device=device)
        mask[0, least_past:] = 1
        feed = {io.ids: torch.tensor([list(prompt)], dtype=torch.int64, device=device)}
        feed[io.mask] = mask
        feed.update(caches.first(least_past))
        result = prefill(feed)
        stored.append(caches.load(result))
        cached[0, least_past : least_past + n] = 1
        token = choose(result[io.logits].cpu().numpy(), rng, temperature)
        out.append(token)
        begin, calls = n, 1
    for i in range(begin, steps):
        past = least_past + i
        token = prompt[i] if i < len(prompt) else token
        slots = caches.slots(past)  # the new token's slot; masked ones between
        mask = torch.zeros((1, slots + 1), dtype=torch.int64, device=device)
        mask[0, :past] = cached[0, :past]
        mask[0, slots] = 1
        feed = {io.ids: torch.tensor([[token]], dtype=torch.int64, device=device)}
        feed[io.mask] = mask
        feed.update(caches.feed(past))
        result = step(feed)
        calls += 1
        stored.append(caches.update(result, past))
        cached[0, past] = 1
        if i >= len(prompt) - 1:
            logits = result[io.logits]
            token = choose(logits.cpu().numpy(), rng, temperature)
            out.append(token)
    seconds = time.perf_counter() - start
    return Generated(tuple(out), calls, seconds, tuple(stored), isinstance(caches, InPlaceCaches))


@dataclass(frozen=True)
class TokenBytes:
    """Device-memory bytes one step moves at a past length: the plan's
    (predicted), and the floor of weights and cache read once."""

    past: int
    predicted: int  # the plan's kernels' bytes at that past
    weights: int  # the matmuls' constant operands
    cache: int  # the past caches read

    @property
    def floor(self) -> int:
        return self.weights + self.cache


def token_bytes(plan, constants: Mapping[str, np.ndarray], caches: Mapping[str, int], past: int):
    """``TokenBytes`` of ``plan`` (priced at ``past``) whose cache inputs take
    ``caches`` bytes there."""
    matmuls = {name for p in plan.primitives if p.op == "matmul" for name in p.inputs}
    weights = sum(constants[n].nbytes for n in matmuls if n in constants)
    predicted = sum(k.bytes for k in plan.kernels)
    return TokenBytes(past, predicted, weights, sum(caches.values()))
