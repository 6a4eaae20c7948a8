"""A bundle is data: edited bundles, even with their hashes recomputed,
never get to run code, and malformed ones are one line and exit 2.

Each case copies a good bundle, edits one file, recomputes that file's
sha256 in the manifest (what an attacker would do) and goes through
``orchestrate.load`` and ``orchestrate run``.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import orchestrate
from orchestrate import cli
from orchestrate.errors import InputError
from tests.bundle.test_bundle import _model


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("untrusted")
    src = root / "small.onnx"
    onnx.save(_model(), src)
    out = orchestrate.optimize(src, root / "small.orch", trials=1, reproducible=True).path
    x = np.random.default_rng(1).standard_normal((3, 17)).astype(np.float32)
    np.save(root / "x.npy", x)
    return out, root / "x.npy"


def edited(good, tmp_path, name: str, edit) -> tuple:
    """A copy of the bundle with ``edit(bytes) -> bytes`` applied to ``name``
    and the manifest's hash of it recomputed."""
    out, x = good
    copy = tmp_path / "edited.orch"
    shutil.copytree(out, copy)
    path = copy / name
    path.write_bytes(edit(path.read_bytes()))
    if name != "manifest.json":
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
        (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy, x


def refused(bundle, x, needle: str) -> None:
    """load raises InputError, and `orchestrate run` says one line, exit 2."""
    with pytest.raises(InputError, match=needle):
        orchestrate.load(bundle)
    r = CliRunner().invoke(cli.main, ["run", str(bundle), "--input", f"x={x}"])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("orchestrate: error:"), r.output


def _code(marker) -> bytes:
    return f"\nopen({str(marker)!r}, 'w').write('ran')\n".encode()


@pytest.mark.parametrize("how", ["append", "replace", "prepend"])
def test_code_put_into_kernels_py_never_runs(good, tmp_path, how):
    marker = tmp_path / "RAN"
    edit = {
        "append": lambda b: b + _code(marker),
        "prepend": lambda b: _code(marker) + b,
        "replace": lambda b: _code(marker) + b"KERNELS = {}\n",
    }[how]
    copy, x = edited(good, tmp_path, "kernels.py", edit)
    refused(copy, x, "kernels.py is not the source orchestrate generates")
    r = CliRunner().invoke(
        cli.main, ["verify", str(copy), "--model", str(good[0].parent / "small.onnx")]
    )
    assert r.exit_code == 2 and "bundle was edited" in r.output
    assert not marker.exists()


def test_an_unedited_bundle_runs_the_source_it_ships(good, tmp_path):
    out, x = good
    loaded = orchestrate.load(out)
    got = loaded.run({"x": np.load(x)})
    assert set(got) == {"y", "z"}
    # the module that ran was compiled from memory, not imported from the bundle
    launcher, _ = next(iter(loaded.program.launches.values()))
    assert launcher.__code__.co_filename.startswith("<orchestrate kernels ")


def _json_edit(fn):
    def edit(raw: bytes) -> bytes:
        data = json.loads(raw)
        fn(data)  # edits in place
        return json.dumps(data).encode()

    return edit


def _set(path, value):
    def fn(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return fn


PLAN_EDITS = {
    "not JSON": (lambda b: b[:-20], "plan.json is not valid JSON"),
    "a list": (lambda b: b"[1, 2]", "not an orchestrate plan"),
    "kernels a number": (_json_edit(_set(["kernels"], 5)), r"plan.kernels: expected a list"),
    "shape a string": (
        _json_edit(_set(["primitives", 0, "shape"], "3x17")),
        r"plan.primitives\[0\].shape: expected a list",
    ),
    "shape changed": (_json_edit(_set(["primitives", 0, "shape"], [17, 3])), "type"),
    "huge shape": (
        _json_edit(_set(["graph", "input_types", 0, "shape"], [10**9, 10**9])),
        "more than",
    ),
    "unknown op": (_json_edit(_set(["primitives", 0, "op"], "system")), "unknown op 'system'"),
    "unknown kernel name": (_json_edit(_set(["kernels", 0, "name"], "evil")), "expected the name"),
    "unknown template": (
        _json_edit(_set(["kernels", 0, "template"], "evil")),
        "kernel 'k000_[a-z_]+': unknown template 'evil'",
    ),
    "kernel hash": (_json_edit(_set(["kernels", 0, "hash"], "0" * 16)), "does not match"),
    "unknown field": (_json_edit(_set(["kernels", 0, "extra"], 1)), "unknown field 'extra'"),
    "attr of a wrong kind": (
        _json_edit(_set(["primitives", 0, "attrs"], {"x": {"a": 1}})),
        "expected an attribute value",
    ),
    "block size": (
        _json_edit(_set(["kernels", 0, "config", "num_warps"], -4)),
        "expected a positive integer",
    ),
    "kernel dropped": (_json_edit(lambda d: d["kernels"].pop()), "do not run every primitive"),
}


@pytest.mark.parametrize("case", sorted(PLAN_EDITS))
def test_edited_plan_is_one_line(good, tmp_path, case):
    edit, needle = PLAN_EDITS[case]
    copy, x = edited(good, tmp_path, "plan.json", edit)
    refused(copy, x, needle)


MANIFEST_EDITS = {
    "a list": (lambda b: b"[]", "manifest.json is not a JSON object"),
    "not JSON": (lambda b: b"{", "manifest.json is not valid JSON"),
    "unknown field": (_json_edit(_set(["run"], "rm -rf /")), "unknown field 'run'"),
    "unknown constant key": (
        _json_edit(_set(["constants", "w"], "c99")),
        "weights.npz does not hold exactly",
    ),
    "constants a list": (_json_edit(_set(["constants"], ["w"])), "field 'constants' must be"),
    "hash not hex": (_json_edit(_set(["files", "plan.json"], "x")), "field 'files' must be"),
    "model file a number": (_json_edit(_set(["model", "file"], 3)), "field 'model' must be"),
    "shapes of strings": (_json_edit(_set(["shapes"], {"x": ["3"]})), "field 'shapes' must be"),
    "older format": (_json_edit(_set(["format"], "orchestrate-bundle/2")), "older orchestrate"),
    "format 3": (
        _json_edit(_set(["format"], "orchestrate-bundle/3")),
        "without the list of bfloat16",
    ),
    "format 4": (_json_edit(_set(["format"], "orchestrate-bundle/4")), "without library kernels"),
    "bfloat16 missing": (_json_edit(lambda d: d.pop("bfloat16")), "lacks the field 'bfloat16'"),
    "bfloat16 a string": (_json_edit(_set(["bfloat16"], "w")), "field 'bfloat16' must be"),
    "bfloat16 unknown": (_json_edit(_set(["bfloat16"], ["nope"])), "lists 'nope' as bfloat16"),
    "bfloat16 of a float32": (
        _json_edit(_set(["bfloat16"], ["w"])),
        "listed as bfloat16 but holds float32",
    ),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_EDITS))
def test_edited_manifest_is_one_line(good, tmp_path, case):
    edit, needle = MANIFEST_EDITS[case]
    copy, x = edited(good, tmp_path, "manifest.json", edit)
    refused(copy, x, needle)


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_weights_with_objects_or_foreign_dtypes_are_one_line(good, tmp_path):
    keys = json.loads((good[0] / "manifest.json").read_text())["constants"]
    arrays = dict(np.load(good[0] / "weights.npz"))
    first = next(iter(arrays))
    cases = {
        "objects": ({**arrays, first: np.array([{"a": 1}], dtype=object)}, "not a plain numpy"),
        "big-endian": ({**arrays, first: arrays[first].astype(">f4")}, "never writes"),
        "complex": ({**arrays, first: arrays[first].astype(np.complex64)}, "never writes"),
        "extra array": ({**arrays, "c99": np.zeros(1)}, "does not hold exactly"),
        "not a zip": (None, "not a plain numpy archive"),
    }
    assert first in keys.values()
    for case, (content, needle) in cases.items():
        raw = b"not a zip" if content is None else _npz(**content)
        copy, x = edited(good, tmp_path / case, "weights.npz", lambda b, raw=raw: raw)
        refused(copy, x, needle)


def test_explain_of_a_json_file_that_is_not_a_plan_is_one_line(tmp_path):
    for i, text in enumerate(
        [
            "[1, 2]",
            '{"format": "orchestrate-plan/5", "kernels": 5}',
            "{",
            '{"format": "orchestrate-plan/5"}',
        ]
    ):
        path = tmp_path / f"p{i}.json"
        path.write_text(text)
        r = CliRunner().invoke(cli.main, ["explain", str(path)])
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1, r.output
        assert lines[0].startswith("orchestrate: error:") and str(path) in lines[0]
