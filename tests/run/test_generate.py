"""Decoding with a decode-step bundle (``run/generate.py``): the loop on a
toy step, then the example decoders (``examples/decode.py``) exported by both
exporters, optimized once for a range of past lengths and decoded in the
interpreter, token for token against the same loop over onnxruntime, over
the caches kept in place and over the graph's own concat."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import orchestrate
from examples import decode
from orchestrate import bundle as bundle_files
from orchestrate.errors import InputError
from orchestrate.frontend.decode import decode_io
from orchestrate.run import generate as gen
from tests.test_cli import assert_user_error, invoke

VOCAB = 11


def _toy_step(seen: list, in_place: bool = False):
    """The next token is (the attended slots + the token) mod VOCAB; the cache
    keeps every token fed, one row each: returned whole, or (``in_place``)
    only the new row, the step reading the first ``past`` rows of a buffer."""

    def step(feed):
        seen.append({k: v.clone() for k, v in feed.items()})
        mask, token = feed["attention_mask"], int(feed["input_ids"][0, 0])
        logits = torch.zeros((1, 1, VOCAB))
        logits[0, 0, (int(mask.sum()) + token) % VOCAB] = 1.0
        row = torch.full((1, 1, 2), float(token))
        past = feed["past_k"][:, : mask.shape[1] - 1]
        present = row if in_place else torch.cat([past, row], dim=1)
        return {"logits": logits, "present_k": present}

    return step


IO = decode_io(["input_ids", "attention_mask", "past_k"], ["logits", "present_k"], "toy")
SHAPES = {"past_k": ((1, 0, 2), 1, "float32")}


def test_the_loop_feeds_the_prompt_then_its_own_tokens_over_masked_padding():
    """Two masked slots pad the cache to the range's least past; the prompt
    goes in one token per step, then each chosen token; the cache fed back
    grows by a row a step."""
    seen: list = []
    caches = gen.caches_for(IO, SHAPES, None, 2, "cpu")
    made = gen.generate(_toy_step(seen), IO, caches, [4, 7], 3, least_past=2)
    # attended slots at the steps choosing: 2 (tokens 4, 7), 3, 4
    want, token = [], 7
    for attended in (2, 3, 4):
        token = (attended + token) % VOCAB
        want.append(token)
    assert made.tokens == tuple(want) and made.steps == 4 and not made.in_place
    assert [f["attention_mask"].tolist() for f in seen[:2]] == [[[0, 0, 1]], [[0, 0, 1, 1]]]
    assert [f["past_k"].shape[1] for f in seen] == [2, 3, 4, 5]
    assert seen[3]["past_k"][0, :, 0].tolist() == [0, 0, 4, 7, want[0]]
    # the whole cache taken back each step: 3, 4, 5, 6 rows of 2 floats
    assert made.cache_bytes == (24, 32, 40, 48)


def test_the_loop_over_a_buffer_writes_one_row_a_step():
    """The same decode over a buffer of 8 rows: the same tokens, each step's
    row written at its past length, 8 bytes stored a step whatever the past."""
    grown = gen.generate(_toy_step([]), IO, gen.caches_for(IO, SHAPES, None, 2, "cpu"), [4, 7], 3)
    seen: list = []
    caches = gen.caches_for(IO, SHAPES, 8, 2, "cpu")
    made = gen.generate(_toy_step(seen, in_place=True), IO, caches, [4, 7], 3, least_past=2)
    assert made.tokens == grown.tokens and made.in_place
    assert made.cache_bytes == (8, 8, 8, 8)
    assert [f["past_k"].shape[1] for f in seen] == [8, 8, 8, 8]  # the buffer, never copied
    assert caches.buffers["past_k"][0, :, 0].tolist() == [0, 0, 4, 7, *made.tokens[:2], 0, 0]


def test_sampling_is_seeded():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]]))
    draws = [gen.choose(logits, np.random.default_rng(5), 1.0) for _ in range(3)]
    assert len(set(draws)) == 1
    many = [gen.choose(logits, np.random.default_rng(s), 1.0) for s in range(200)]
    assert set(many) == {0, 1, 2, 3}  # not the argmax every time
    assert gen.choose(logits, None, 1.0) == 3


def test_what_is_not_a_decode_step_or_a_decode_is_refused():
    with pytest.raises(InputError, match="not a decode step: it has no attention_mask"):
        decode_io(["input_ids", "past_k"], ["logits", "present_k"], "m.orch")
    with pytest.raises(InputError, match="cache input past_k has no present_k output"):
        decode_io(["input_ids", "attention_mask", "past_k"], ["logits"], "m.orch")
    hf = decode_io(
        ["input_ids", "attention_mask", "past_key_values.0.key"], ["logits", "present.0.key"], "x"
    )
    assert hf.caches == (("past_key_values.0.key", "present.0.key"),)

    def caches():
        return gen.caches_for(IO, SHAPES, None, 1, "cpu")

    with pytest.raises(InputError, match="need a past of 9; the bundle's range ends at 8"):
        gen.generate(_toy_step([]), IO, caches(), [1, 2], 8, least_past=1, most_past=8)
    gen.generate(_toy_step([]), IO, caches(), [1, 2], 7, least_past=1, most_past=8)  # fits
    with pytest.raises(InputError, match="--prompt-ids"):
        gen.generate(_toy_step([]), IO, caches(), [], 3)
    with pytest.raises(InputError, match="token -1 is negative"):
        gen.generate(_toy_step([]), IO, caches(), [2, -1], 3)


def _ort_step(path):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def step(feed):
        got = session.run(None, {k: np.asarray(v) for k, v in feed.items()})
        return {k: torch.from_numpy(v) for k, v in zip(names, got)}

    return step


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The Llama-style step exported by torch.export (its mask's axis written
    ``past + 1``), optimized once for past lengths 1..2048."""
    d = tmp_path_factory.mktemp("llama")
    src = d / "llama.onnx"
    decode.export_decode("llama", src, dynamo=True)
    mask = next(i for i in onnx.load(str(src)).graph.input if i.name == "attention_mask")
    assert mask.type.tensor_type.shape.dim[1].dim_param == "past + 1"
    orchestrate.optimize(src, d / "llama.orch", dims={"past": "1..2048@512"}, trials=1)
    return src, d / "llama.orch"


def test_one_bundle_matches_onnxruntime_at_every_past_length(llama):
    src, out = llama
    bundle = orchestrate.load(out)
    step = _ort_step(src)
    for past in (1, 7, 100, 511, 2048):
        feed = {
            k: v.numpy()
            for k, v in zip(decode.INPUTS, decode.example_inputs(decode.config("llama"), past))
        }
        got, want = bundle.run(feed), step(feed)
        for name in decode.OUTPUTS:
            np.testing.assert_allclose(
                got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} {past}"
            )
    feed["attention_mask"] = np.ones((1, 9), np.int64)  # past + 1 = 9: past 8, not 2048
    with pytest.raises(InputError, match=r"axis 1 \(past \+ 1\) gives past=8"):
        bundle.run(feed)


def _greedy_both(src, out, prompt, new):
    """The bundle's greedy tokens (over its in-place step where it has one),
    and onnxruntime's over the graph's own step."""
    bundle = orchestrate.load(out)
    made = bundle.generate(prompt, new)
    assert made.in_place == ("in_place" in bundle.manifest)
    io, shapes, least, most = bundle.decoding()
    caches = gen.caches_for(io, shapes, None, least, "cpu")
    ort_made = gen.generate(_ort_step(src), io, caches, prompt, new, least_past=least)
    return made, ort_made


def test_llama_decodes_onnxruntimes_greedy_tokens(llama):
    src, out = llama
    made, ort_made = _greedy_both(src, out, [1, 2, 3], 16)
    assert made.tokens == ort_made.tokens
    assert list(made.tokens) == decode.greedy_reference("llama", [1, 2, 3], 16)


def test_the_cache_in_place_equals_the_concat_and_stores_one_row_a_step(llama):
    """The bundle's two steps over 6 tokens: the same logits' tokens, the
    buffer's first rows equal to the grown cache, one row per cache stored a
    step (2 layers x 2 heads x 16 floats, K and V) against the whole cache."""
    _, out = llama
    bundle = orchestrate.load(out)
    io, shapes, least, _ = bundle.decoding()
    grown = gen.caches_for(io, shapes, None, least, "cpu")
    concat = gen.generate(bundle.run, io, grown, [1, 2], 5, least_past=least)
    rows = bundle.manifest["in_place"]["capacity"]
    kept = gen.caches_for(io, shapes, rows, least, "cpu")
    in_place = gen.generate(bundle.in_place().run, io, kept, [1, 2], 5, least_past=least)
    assert in_place.tokens == concat.tokens
    row = 2 * 1 * 2 * 1 * 16 * 4
    assert in_place.cache_bytes == (2 * row,) * 6
    assert concat.cache_bytes == tuple(2 * row * (least + k + 1) for k in range(6))
    for past, _ in io.caches:
        n = grown.caches[past].shape[3]
        torch.testing.assert_close(kept.buffers[past][:, :, :, :n], grown.caches[past])
        assert not kept.buffers[past][:, :, :, n:].any()  # nothing written past the rows


def test_past_lengths_round_up_to_a_bucket_of_one_program(llama):
    """The Llama step reads positions from the mask, so optimize found masked
    slots change nothing and recorded buckets of 64: its 6 steps (past 1..6)
    all run at past 64, one Program, and decode the exact steps' tokens."""
    _, out = llama
    bundle = orchestrate.load(out)
    assert bundle.manifest["in_place"]["bucket"] == 64
    made = bundle.generate([1, 2], 5)
    exact = orchestrate.load(out)
    io, shapes, least, most = exact.decoding()
    rows = exact.manifest["in_place"]["capacity"]
    caches = gen.caches_for(io, shapes, rows, least, "cpu", 1, most)
    one_each = gen.generate(exact.in_place().run, io, caches, [1, 2], 5, least_past=least)
    assert made.tokens == one_each.tokens
    assert bundle.in_place().program.cached == ((64,),)
    assert exact.in_place().program.made == 6


def _written(bundle, past: int) -> int:
    """Bytes the plan's kernels write at ``past`` (views write nothing)."""
    graph = bundle.graph_at((past,))
    return sum(
        graph.types[o].nbytes
        for k in bundle.plan.kernels
        if k.template != "view"
        for o in k.outputs
    )


def test_the_in_place_step_writes_the_same_bytes_at_every_past_length(llama):
    """From past 1 to past 2048 the in-place step's kernels write one float
    more per past position (the mask's additive bias over the keys), none of
    the cache; the graph's own step writes the whole cache, twice (each
    layer's concat, then the stack into present)."""
    _, out = llama
    bundle = orchestrate.load(out)
    in_place = bundle.in_place()
    assert _written(in_place, 2048) - _written(in_place, 1) == 2047 * 4
    cache = 2 * 2 * 1 * 2 * 16 * 4  # K and V, a row of both layers
    assert _written(bundle, 2048) - _written(bundle, 1) >= 2 * 2047 * cache


@pytest.mark.parametrize("style, in_place", [("qwen2", True), ("gpt2", False)])
def test_qwen2_and_gpt2_decode_onnxruntimes_greedy_tokens(tmp_path, style, in_place):
    """The TorchScript exporter, which writes the mask's axis as it is named;
    GPT-2's bundle made without its in-place step decodes over the concat."""
    src = tmp_path / f"{style}.onnx"
    decode.export_decode(style, src, dynamo=False)
    out = tmp_path / f"{style}.orch"
    orchestrate.optimize(src, out, dims={"past": "1..64@16"}, trials=1, in_place_cache=in_place)
    assert (out / "in_place").is_dir() == in_place
    made, ort_made = _greedy_both(src, out, [5, 9], 16)
    assert made.tokens == ort_made.tokens
    assert list(made.tokens) == decode.greedy_reference(style, [5, 9], 16)


def test_the_command_prints_tokens_speed_and_bytes_per_token(llama):
    _, out = llama
    r = invoke("generate", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "3")
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[-3] == ",".join(map(str, decode.greedy_reference("llama", [1, 2, 3], 3)))
    assert "tokens/s" in lines[-2] and "predicted bytes per token at past=512" in lines[-1]
    sampled = invoke("generate", out, "--prompt-ids", "1", "--max-new-tokens", "4", "--sample")
    again = invoke("generate", out, "--prompt-ids", "1", "--max-new-tokens", "4", "--sample")
    assert (
        sampled.exit_code == 0 and sampled.output.splitlines()[-3] == again.output.splitlines()[-3]
    )
    assert_user_error(invoke("generate", out, "--prompt-ids", "1,x"), "--prompt-ids")
    assert_user_error(
        invoke("generate", out, "--prompt-ids", "1", "--max-new-tokens", "4000"), "2048"
    )


def test_a_fixed_shape_bundle_is_refused(tmp_path):
    src = tmp_path / "gpt2.onnx"
    decode.export_decode("gpt2", src, dynamo=False)
    out = tmp_path / "fixed.orch"
    orchestrate.optimize(src, out, dims={"past": "4"}, trials=1)
    assert_user_error(invoke("generate", out, "--prompt-ids", "1"), "range of past lengths")


def test_the_in_place_step_is_checked_as_part_of_the_bundle(llama, tmp_path):
    """The bundle may be replaced as a whole; a changed file of its in_place/
    step, or a step not the one its manifest names, is refused."""
    _, out = llama
    copy = tmp_path / "copy.orch"
    shutil.copytree(out, copy)
    assert bundle_files.replace_problem(copy) is None
    inner = copy / bundle_files.IN_PLACE
    (inner / "report.md").write_text("edited\n")
    assert "in_place/ report.md was changed" in bundle_files.replace_problem(copy)
    with pytest.raises(InputError, match="report.md was modified"):
        orchestrate.load(copy).in_place()
    manifest = json.loads((inner / "manifest.json").read_text())
    manifest["files"]["report.md"] = bundle_files.sha256(inner / "report.md")
    (inner / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="is not the one .* names"):
        orchestrate.load(copy).in_place()


def test_the_in_place_step_stores_and_loads_the_weights_once(llama):
    """in_place/ keeps none of the outer bundle's constants again: its
    manifest takes them from the outer weights.npz, loading gives the outer
    bundle's arrays, and both steps' Programs run on the same tensors."""
    _, out = llama
    outer = bundle_files.read(out)
    inner_manifest = json.loads((out / bundle_files.IN_PLACE / "manifest.json").read_text())
    taken = inner_manifest["outer_constants"]
    assert taken and set(taken) <= set(outer.constants)
    assert not set(taken) & set(inner_manifest["constants"])
    # the weights: every matmul's weight is the outer bundle's, not a copy
    big = [k for k in taken if outer.constants[k].size >= 256]
    assert len(big) >= 4
    bundle = orchestrate.load(out)
    step = bundle.in_place()
    assert all(step._constants[k] is bundle._constants[k] for k in taken)
    opt = bundle.program.program(bundle.family.at("opt")).constants
    here = step.program.program(step.family.at("opt")).constants
    assert all(here[k] is opt[k] for k in big)


def test_weights_taken_from_the_outer_bundle_are_checked(llama, tmp_path):
    """The outer weights.npz an in-place step reads is checked against the
    outer manifest; a name it lacks, or the field outside an in_place/
    folder, is refused by name."""
    _, out = llama
    copy = tmp_path / "copy.orch"
    shutil.copytree(out, copy)
    inner = copy / bundle_files.IN_PLACE
    assert bundle_files.read(inner).constants.keys() >= set(
        json.loads((inner / "manifest.json").read_text())["outer_constants"]
    )
    raw = bytearray((copy / "weights.npz").read_bytes())
    raw[-40] ^= 1
    (copy / "weights.npz").write_bytes(bytes(raw))
    with pytest.raises(InputError, match="weights.npz was modified"):
        bundle_files.read(inner)
    shutil.copy(out / "weights.npz", copy / "weights.npz")
    manifest = json.loads((inner / "manifest.json").read_text())
    manifest["outer_constants"] = sorted([*manifest["outer_constants"], "zz_not_there"])
    (inner / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="'zz_not_there' from .* holds no such constant"):
        bundle_files.read(inner)
    top = json.loads((copy / "manifest.json").read_text())
    top["outer_constants"] = ["a"]
    (copy / "manifest.json").write_text(json.dumps(top))
    with pytest.raises(InputError, match="not a bundle's in_place/"):
        bundle_files.read(copy)


def test_a_failed_in_place_step_leaves_the_bundle_without_it(tmp_path, monkeypatch):
    """Where the in-place step cannot be made, the bundle is written without
    it and optimize says why in one line; generate decodes over the concat."""
    from orchestrate.frontend import decode as rewrite

    def refuse(*args, **kwargs):
        raise InputError("step.onnx (in place): onnxruntime cannot run the model (boom)")

    monkeypatch.setattr(rewrite, "padding_changes", refuse)
    src = tmp_path / "gpt2.onnx"
    decode.export_decode("gpt2", src, dynamo=False)
    made = orchestrate.optimize(src, tmp_path / "g.orch", dims={"past": "1..16@8"}, trials=1)
    assert made.in_place == (
        "in-place cache: not planned (step.onnx (in place): onnxruntime cannot run the "
        "model (boom))"
    )
    bundle = orchestrate.load(tmp_path / "g.orch")
    assert "in_place" not in bundle.manifest and not (tmp_path / "g.orch" / "in_place").exists()
    assert not bundle.generate([1], 2).in_place


def test_a_prefill_bundle_runs_the_prompt_in_one_step(llama, tmp_path):
    """The prompt step (``examples/decode.py --prefill``, the decode step's
    weights) optimized for prompts of 1..8 tokens after the one masked slot
    the decode range starts at: the same tokens as feeding the prompt a token
    a step, and the torch model's, in 1 + 7 steps instead of 4 + 7; a bundle
    whose caches do not start where the decode steps do is refused."""
    _, out = llama
    src = tmp_path / "prefill.onnx"
    decode.export_prefill("llama", src)
    orchestrate.optimize(src, tmp_path / "p.orch", dims={"past": "1", "seq": "1..8@4"}, trials=1)
    bundle, prefill = orchestrate.load(out), orchestrate.load(tmp_path / "p.orch")
    prompt = [5, 9, 3, 7]
    made = bundle.generate(prompt, 8, prefill=prefill)
    each = bundle.generate(prompt, 8)
    assert made.tokens == each.tokens == tuple(decode.greedy_reference("llama", prompt, 8))
    assert (made.steps, each.steps) == (8, 11)
    with pytest.raises(InputError, match="holds past rows; the decode steps start at 1"):
        bundle.generate(prompt, 2, prefill=bundle)
    r = invoke(
        "generate",
        out,
        "--prompt-ids",
        "5,9,3,7",
        "--max-new-tokens",
        "2",
        "--prefill",
        tmp_path / "p.orch",
    )
    assert r.exit_code == 0 and "the prompt in one step" in r.output, r.output
