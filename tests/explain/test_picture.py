"""explain --picture (kernels as Graphviz DOT) and --roofline (matplotlib)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrate import cli, templates
from orchestrate.explain import _bytes, picture
from orchestrate.ir import TensorType
from orchestrate.plan import Plan

MODEL = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny_bert.onnx"
HOSTILE = 'in"put\\ids\nnext <b>&amp;'


def invoke(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args])


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("picture") / "bert.plan.json"
    r = invoke("plan", MODEL, "-o", path, "--device", "h100", "--reproducible")
    assert r.exit_code == 0, r.output
    return path


def _renamed(data, old: str, new: str):
    if isinstance(data, dict):
        return {k: _renamed(v, old, new) for k, v in data.items()}
    if isinstance(data, list):
        return [_renamed(v, old, new) for v in data]
    return new if data == old else data


def _statements(text: str) -> list[str]:
    """The DOT text with every quoted string replaced by Q, checked for what
    a quoted string must not leave behind."""
    strings = re.compile(r'"(?:[^"\\\n]|\\.)*"')
    bare = strings.sub("Q", text)
    assert '"' not in bare and "\\" not in bare, bare
    assert bare.count("{") == bare.count("}") and bare.count("[") == bare.count("]")
    lines = [line.strip() for line in bare.splitlines() if line.strip()]
    assert lines[0] == "digraph plan {" and lines[-1] == "}"
    for line in lines[1:-1]:
        assert line.endswith((";", "{", "}")), line
    return lines


def test_one_box_per_kernel_and_edges_labelled_with_bytes(plan_file, tmp_path):
    out = tmp_path / "bert.dot"
    r = invoke("explain", plan_file, "--picture", out, "--limit", "1")
    assert r.exit_code == 0, r.output
    text = out.read_text()
    lines = _statements(text)
    p = Plan.from_json(json.loads(plan_file.read_text()), templates.NAMES)
    kernels = [k for k in p.kernels if not k.is_view]
    boxes = re.findall(r"^\s*(k\d+) \[label=", text, re.M)
    assert boxes == [k.name.split("_")[0] for k in kernels]
    assert len(lines) > len(kernels)
    # every edge between kernels: its label is the bytes of the tensors its tooltip names
    edges = re.findall(r'^\s*(\w+) -> (\w+) \[label="([^"]*)", tooltip="([^"]*)"', text, re.M)
    assert edges
    types = p.types
    for _src, _dst, label, tip in edges:
        names = [t.rsplit(" ", 1)[0] for t in tip.split(": ", 1)[1].split(", ")]
        assert label == _bytes(sum(TensorType(*types[t]).nbytes for t in names)), (label, tip)
    assert "predicted" in text and "-bound" in text


def test_hostile_names_reach_dot_escaped(plan_file, tmp_path):
    data = _renamed(json.loads(plan_file.read_text()), "input_ids", HOSTILE)
    data["graph"]["name"] = HOSTILE
    text = picture.dot(Plan.from_json(data, templates.NAMES))
    _statements(text)
    assert picture.quote(HOSTILE) in text
    assert picture.quote(HOSTILE) == '"in\\"put\\\\ids\\\\nnext <b>&amp;amp;"'
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=text.encode(), capture_output=True)
        assert done.returncode == 0, done.stderr
        import xml.etree.ElementTree as ET

        svg = ET.fromstring(done.stdout)
        texts = ["".join(t.itertext()) for t in svg.iter("{http://www.w3.org/2000/svg}text")]
        assert 'in"put\\ids\\nnext <b>&amp;' in texts, texts


def test_repeated_block():
    layer = ["norm", "q", "k", "attn", "out"]
    rows = picture.repeated_block(["embed"] + layer * 4 + ["head"])
    assert (rows.period, rows.repeats) == (5, 4)
    assert picture.repeated_block(["a", "b", "c", "d"]) is None


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_svg_rendered_where_dot_is_installed(plan_file, tmp_path):
    out = tmp_path / "bert.svg"
    r = invoke("explain", plan_file, "--picture", out)
    assert r.exit_code == 0, r.output
    assert out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()


def test_without_dot_the_dot_text_is_written(plan_file, tmp_path, monkeypatch):
    monkeypatch.setattr(picture.shutil, "which", lambda name: None)
    r = invoke("explain", plan_file, "--picture", tmp_path / "g.png")
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "g.png").exists()
    assert (tmp_path / "g.dot").read_text().startswith("digraph plan {")
    assert f"dot -Tpng {tmp_path / 'g.dot'} -o {tmp_path / 'g.png'}" in r.output


def test_roofline_chart_is_a_png(plan_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "roof.png"
    r = invoke("explain", plan_file, "--roofline", out)
    assert r.exit_code == 0, r.output
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "predicted" in r.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--roofline", "chart.txt"], "name a .png, .svg or .pdf file"),
        (["--roofline", "no/such/dir/chart.png"], "does not exist"),
        (["--picture", "no/such/dir/g.dot"], "does not exist"),
    ],
)
def test_user_errors_are_one_line(plan_file, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    r = invoke("explain", plan_file, *args)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output
