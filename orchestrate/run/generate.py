"""Decoding tokens with a decode-step bundle: greedy, or sampled with a seed.

A decode step takes one new token and the key/value cache of the earlier
ones and returns the next token's logits and the cache grown by one row
(``examples/decode.py`` exports three). Its interface, found by name
(``decode_io``): ``input_ids`` [1, 1]; ``attention_mask`` [1, past + 1];
one or more ``past*`` inputs, each returned grown as the ``present*`` output
of the same suffix (``past_k`` -> ``present_k``, ``past_key_values.0.key`` ->
``present.0.key``); and ``logits`` (or the one other output).

The bundle must be made for a range of past lengths (``--dim past=1..N``),
one kernels.py for every step. Below the range's least past length the
cache is padded with masked slots (zeros the attention mask hides), so the
prompt's first token can be fed to a bundle whose range starts at 1; a model
that reads positions from the mask (as the examples and Hugging Face's
``generate`` do) is not moved by them. Without a prefill bundle the prompt
is fed one token per step. The cache is grown by the step's own concat (the
graph's outputs are fed back); an in-place cache is not built yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrate.errors import InputError
from orchestrate.text import shown

Step = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class DecodeIO:
    """Which inputs and outputs of a step are which."""

    ids: str
    mask: str
    caches: tuple[tuple[str, str], ...]  # (past input, present output)
    logits: str


@dataclass(frozen=True)
class Generated:
    tokens: tuple[int, ...]  # the new tokens, after the prompt
    steps: int  # steps run (the prompt's included)
    seconds: float  # wall clock of the steps

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("inf")


def _suffix(name: str, prefixes: Sequence[str]) -> str | None:
    for p in prefixes:
        if name.startswith(p):
            return name[len(p) :]
    return None


def decode_io(inputs: Sequence[str], outputs: Sequence[str], where: str) -> DecodeIO:
    """The decode interface of a step with these inputs and outputs, or an
    InputError naming what is missing (``where``: the bundle)."""
    missing = [n for n in ("input_ids", "attention_mask") if n not in inputs]
    presents = {_suffix(o, ("present",)): o for o in outputs if o.startswith("present")}
    caches = []
    for name in inputs:
        suffix = _suffix(name, ("past_key_values", "past"))
        if suffix is None:
            continue
        if suffix not in presents:
            raise InputError(
                f"{where}: cache input {shown(name)} has no present{shown(suffix)} output "
                "to feed back"
            )
        caches.append((name, presents[suffix]))
    others = [o for o in outputs if o not in presents.values()]
    logits = "logits" if "logits" in others else (others[0] if len(others) == 1 else None)
    if missing or not caches or logits is None:
        lacks = missing + (["a past* cache input"] if not caches else [])
        lacks += ["a logits output"] if logits is None else []
        raise InputError(
            f"{where}: not a decode step: it has no {', no '.join(lacks)} "
            "(see examples/decode.py for the interface)"
        )
    return DecodeIO("input_ids", "attention_mask", tuple(caches), logits)


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
    cache_shapes: Mapping[str, tuple[tuple[int, ...], int, str]],
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    least_past: int = 0,
    most_past: int | None = None,
    sample: bool = False,
    seed: int = 0,
    temperature: float = 1.0,
) -> Generated:
    """Decode ``max_new_tokens`` after ``prompt`` with ``step``.

    ``cache_shapes``: per cache input, (its shape, the axis that grows, its
    dtype); its length on that axis is ignored. The cache starts with
    ``least_past`` masked slots; a step beyond ``most_past`` is refused."""
    if not prompt:
        raise InputError("--prompt-ids: give at least one token")
    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {max_new_tokens}: expected at least 1")
    if any(t < 0 for t in prompt):  # (past the vocabulary: the step's gather refuses it)
        raise InputError(f"--prompt-ids: token {min(prompt)} is negative")
    if sample and not temperature > 0:
        raise InputError(f"--temperature {temperature}: expected more than 0")
    steps = len(prompt) + max_new_tokens - 1
    last = least_past + steps - 1  # the past length of the last step
    if most_past is not None and last > most_past:
        raise InputError(
            f"{len(prompt)} prompt and {max_new_tokens} new tokens need a past of {last}; "
            f"the bundle's range ends at {most_past}"
        )
    caches = {}
    for name, (shape, axis, dtype) in cache_shapes.items():
        shape = list(shape)
        shape[axis] = least_past
        caches[name] = np.zeros(shape, dtype=dtype)
    mask = [0] * least_past
    rng = np.random.default_rng(seed) if sample else None
    out: list[int] = []
    token = prompt[0]
    start = time.perf_counter()
    for i in range(steps):
        token = prompt[i] if i < len(prompt) else token
        mask.append(1)
        feed = {io.ids: np.array([[token]], dtype=np.int64)}
        feed[io.mask] = np.array([mask], dtype=np.int64)
        feed.update(caches)
        result = step(feed)
        caches = {past: np.asarray(result[present]) for past, present in io.caches}
        if i >= len(prompt) - 1:
            token = choose(np.asarray(result[io.logits]), rng, temperature)
            out.append(token)
    return Generated(tuple(out), steps, time.perf_counter() - start)


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
