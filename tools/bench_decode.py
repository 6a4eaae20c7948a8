"""Decoding speed: a decode step's tokens a second, over the caches kept in
place, over the graph's own concat, and in torch eager.

    python -m tools.bench_decode [--size wide|tiny] [--tokens N] [--dtype fp16] [--out DIR]

``make bench-decode`` on a lent GPU, after ``make bench-gpu`` where time is
left (it is not in that run's budget). The decode step of the benchmark's
Llama-style decoder (``examples/decode.py``'s ``WIDE``: four layers at width
2048, 16 heads over 4 key/value heads) is exported with its past length
dynamic, optimized once for past lengths 1..2 x 512 (verified there, at MIN,
OPT and MAX), and decodes ``--tokens`` new tokens after a three-token prompt
three ways, each after a warm-up decode (compiles, captures):

* ``in place``: ``Bundle.generate``, the caches in buffers written a row a
  step, past lengths rounded up to the bundle's buckets (one CUDA graph a
  bucket, the caches resident);
* ``concat``: ``generate(in_place=False)``, the graph's own step, each
  step's ``present*`` fed back (a new past length, so a new Program, a step);
* ``torch eager``: the same torch module on the device, the same loop.

Each gives milliseconds a step, tokens a second, the tokens themselves (the
first two must agree; eager's are compared) and the plan's predicted bytes
per token against the floor of weights and cache read. Printed, and written
to ``DIR/decode.json`` (``$OUT`` when set, else ``out/bench-decode``). On a
CPU (``--size tiny``, the Triton interpreter) the times say nothing about a
GPU: the run proves the mechanics.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PROMPT = (1, 2, 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench_decode")
    p.add_argument("--size", default="wide", choices=("wide", "tiny"))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--dtype", default="fp16", choices=("fp32", "fp16", "bf16"))
    p.add_argument("--device", default=None, help="the GPU to plan for (default: the one present)")
    p.add_argument("--out", type=Path, default=Path("out/bench-decode"))
    args = p.parse_args(argv)
    out = Path(os.environ.get("OUT") or args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    import orchestrate
    from examples import build_model
    from examples.decode import export_step

    step, _ = build_model("decode", args.size, seed=0)
    past = step.c.past
    src, bundle_dir = out / f"{args.size}_decode.onnx", out / f"{args.size}_decode.orch"
    started = time.perf_counter()
    export_step(step, src, dynamo=False)
    say(f"exported {src} in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    options = {"device": args.device} if args.device else {}
    made = orchestrate.optimize(
        src,
        bundle_dir,
        dims={"past": f"1..{2 * past}@{past}"},
        dtype=None if args.dtype == "fp32" else args.dtype,
        trials=0,
        **options,
    )
    say(f"optimized and verified in {time.perf_counter() - started:.1f} s; {made.in_place}")
    bundle = orchestrate.load(bundle_dir)
    device = "cpu" if bundle.interpret else "cuda"
    where = (
        "the Triton interpreter on a CPU: not a GPU time"
        if bundle.interpret
        else (torch.cuda.get_device_name(0))
    )
    result = {
        "size": args.size,
        "dtype": args.dtype,
        "device": where,
        "prompt": list(PROMPT),
        "new_tokens": args.tokens,
        "ways": {},
    }
    for way, in_place in (("in place", True), ("concat", False)):
        bundle.generate(PROMPT, 2, in_place=in_place)  # warm: compile, capture
        made = bundle.generate(PROMPT, args.tokens, in_place=in_place)
        b = bundle.token_bytes(in_place=in_place)
        result["ways"][way] = _figures(made) | {
            "predicted_bytes_per_token": b.predicted,
            "floor_bytes_per_token": b.floor,
            "bytes_at_past": b.past,
            "cache_bytes_stored_first_last": [made.cache_bytes[0], made.cache_bytes[-1]],
        }
        say(_line(way, result["ways"][way]))
    result["ways"]["torch eager"] = _figures(_eager(step, bundle, args, device))
    say(_line("torch eager", result["ways"]["torch eager"]))
    ways = result["ways"]
    result["in_place_equals_concat"] = ways["in place"]["tokens"] == ways["concat"]["tokens"]
    eager = ways["torch eager"]["tokens"]
    result["tokens_equal_to_eager"] = sum(a == b for a, b in zip(ways["in place"]["tokens"], eager))
    (out / "decode.json").write_text(json.dumps(result, indent=1) + "\n")
    say(
        f"in place and concat decode the same tokens: {result['in_place_equals_concat']}; "
        f"{result['tokens_equal_to_eager']} of {args.tokens} equal to torch eager's"
    )
    say(f"wrote {out / 'decode.json'}")
    return 0 if result["in_place_equals_concat"] else 1


def _eager(step, bundle, args, device: str):
    """The torch module's own decode on ``device``, at the bundle's dtype,
    over the same loop and caches grown by its concat."""
    import torch

    from orchestrate.run import generate as gen

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    module = step.to(device=device, dtype=dtype)
    io, shapes, least, _ = bundle.decoding()
    shapes = {
        k: (shape, axis, str(dtype).removeprefix("torch."))
        for k, (shape, axis, _) in shapes.items()
    }

    @torch.no_grad()
    def run(feed):
        logits, k, v = module(
            feed["input_ids"], feed["attention_mask"], feed["past_k"], feed["past_v"]
        )
        return {"logits": logits.float(), "present_k": k, "present_v": v}

    def decode(n: int):
        caches = gen.caches_for(io, shapes, None, least, device)
        made = gen.generate(run, io, caches, list(PROMPT), n, least_past=least)
        if device == "cuda":
            torch.cuda.synchronize()
        return made

    decode(2)
    return decode(args.tokens)


def _figures(made) -> dict:
    return {
        "ms_per_step": round(1e3 * made.seconds / made.steps, 4),
        "tokens_per_s": round(made.tokens_per_second, 2),
        "tokens": list(made.tokens),
    }


def _line(way: str, f: dict) -> str:
    text = f"{way}: {f['ms_per_step']:.3f} ms a step, {f['tokens_per_s']:.1f} tokens/s"
    if "predicted_bytes_per_token" in f:
        text += (
            f"; predicted {f['predicted_bytes_per_token']:,} bytes a token at past "
            f"{f['bytes_at_past']} against a floor of {f['floor_bytes_per_token']:,}"
        )
    return text


def say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
