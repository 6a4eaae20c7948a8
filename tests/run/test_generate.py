"""Decoding with a decode-step bundle (``run/generate.py``): the loop on a
step made of numpy, then the example decoders (``examples/decode.py``)
exported by both exporters, optimized once for a range of past lengths and
decoded in the interpreter, token for token against the same loop over
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import orchestrate
from examples import decode
from orchestrate.errors import InputError
from orchestrate.run import generate as gen
from tests.test_cli import assert_user_error, invoke

VOCAB = 11


def _toy_step(seen: list):
    """The next token is (the attended slots + the token) mod VOCAB; the cache
    keeps every token fed, one row each."""

    def step(feed):
        seen.append(feed)
        mask, token = feed["attention_mask"], int(feed["input_ids"][0, 0])
        logits = np.zeros((1, 1, VOCAB), np.float32)
        logits[0, 0, (int(mask.sum()) + token) % VOCAB] = 1.0
        row = np.full((1, 1, 2), token, np.float32)
        return {"logits": logits, "present_k": np.concatenate([feed["past_k"], row], axis=1)}

    return step


IO = gen.decode_io(["input_ids", "attention_mask", "past_k"], ["logits", "present_k"], "toy")


def test_the_loop_feeds_the_prompt_then_its_own_tokens_over_masked_padding():
    """Two masked slots pad the cache to the range's least past; the prompt
    goes in one token per step, then each chosen token; the cache fed back
    grows by a row a step."""
    seen: list = []
    made = gen.generate(
        _toy_step(seen), IO, {"past_k": ((1, 0, 2), 1, "float32")}, [4, 7], 3, least_past=2
    )
    # attended slots at the steps choosing: 2 (tokens 4, 7), 3, 4
    want, token = [], 7
    for attended in (2, 3, 4):
        token = (attended + token) % VOCAB
        want.append(token)
    assert made.tokens == tuple(want) and made.steps == 4
    assert [f["attention_mask"].tolist() for f in seen[:2]] == [[[0, 0, 1]], [[0, 0, 1, 1]]]
    assert [f["past_k"].shape[1] for f in seen] == [2, 3, 4, 5]
    assert seen[3]["past_k"][0, :, 0].tolist() == [0, 0, 4, 7, want[0]]


def test_sampling_is_seeded():
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]]))
    draws = [gen.choose(logits, np.random.default_rng(5), 1.0) for _ in range(3)]
    assert len(set(draws)) == 1
    many = [gen.choose(logits, np.random.default_rng(s), 1.0) for s in range(200)]
    assert set(many) == {0, 1, 2, 3}  # not the argmax every time
    assert gen.choose(logits, None, 1.0) == 3


def test_what_is_not_a_decode_step_or_a_decode_is_refused():
    with pytest.raises(InputError, match="not a decode step: it has no attention_mask"):
        gen.decode_io(["input_ids", "past_k"], ["logits", "present_k"], "m.orch")
    with pytest.raises(InputError, match="cache input past_k has no present_k output"):
        gen.decode_io(["input_ids", "attention_mask", "past_k"], ["logits"], "m.orch")
    hf = gen.decode_io(
        ["input_ids", "attention_mask", "past_key_values.0.key"], ["logits", "present.0.key"], "x"
    )
    assert hf.caches == (("past_key_values.0.key", "present.0.key"),)
    shapes = {"past_k": ((1, 0, 2), 1, "float32")}
    with pytest.raises(InputError, match="need a past of 9; the bundle's range ends at 8"):
        gen.generate(_toy_step([]), IO, shapes, [1, 2], 8, least_past=1, most_past=8)
    gen.generate(_toy_step([]), IO, shapes, [1, 2], 7, least_past=1, most_past=8)  # fits
    with pytest.raises(InputError, match="--prompt-ids"):
        gen.generate(_toy_step([]), IO, shapes, [], 3)
    with pytest.raises(InputError, match="token -1 is negative"):
        gen.generate(_toy_step([]), IO, shapes, [2, -1], 3)


def _ort_step(path):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feed: dict(zip(names, session.run(None, dict(feed))))


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


def _greedy_both(src, out, prompt, new):
    bundle = orchestrate.load(out)
    made = bundle.generate(prompt, new)
    io, shapes, least, most = bundle.decoding()
    ort_made = gen.generate(_ort_step(src), io, shapes, prompt, new, least_past=least)
    return made, ort_made


def test_llama_decodes_onnxruntimes_greedy_tokens(llama):
    src, out = llama
    made, ort_made = _greedy_both(src, out, [1, 2, 3], 16)
    assert made.tokens == ort_made.tokens
    assert list(made.tokens) == decode.greedy_reference("llama", [1, 2, 3], 16)


@pytest.mark.parametrize("style", ["qwen2", "gpt2"])
def test_qwen2_and_gpt2_decode_onnxruntimes_greedy_tokens(tmp_path, style):
    """The TorchScript exporter, which writes the mask's axis as it is named."""
    src = tmp_path / f"{style}.onnx"
    decode.export_decode(style, src, dynamo=False)
    out = tmp_path / f"{style}.orch"
    orchestrate.optimize(src, out, dims={"past": "1..64@16"}, trials=1)
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
