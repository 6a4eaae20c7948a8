"""Helpers of the fuzz suite (tests/test_fuzz.py): hypothesis profiles, the
one property every command must keep, file-tree snapshots, tiny models and
bundle edits.

The property: a command exits 0 with the right answer, or exits 2 with one
line on stderr that starts with ``orchestrate: error:``.  Never a traceback,
never exit 3 (internal error), nothing half-written, nothing outside the
output touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, event, settings
from onnx import helper, numpy_helper

# -- profiles -----------------------------------------------------------------
#
# "ci" (the default, part of `make test`): few examples per property, the same
# ones every run (derandomize, no example database), so the suite is bounded
# and deterministic.  "fuzz" (ORCHESTRATE_FUZZ=1, `make fuzz`): many random
# examples; failures are saved in .hypothesis/ and replayed first next time.

FUZZ = os.environ.get("ORCHESTRATE_FUZZ", "") not in ("", "0")
PROFILE = "fuzz" if FUZZ else "ci"
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# ci does not shrink: a property that fails today is xfail, and its minimal
# case is a regression test of its own
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=_HEALTH,
    phases=(Phase.explicit, Phase.generate),
)
settings.register_profile(
    "fuzz", deadline=None, derandomize=False, print_blob=True, suppress_health_check=_HEALTH
)


def examples(ci: int, fuzz: int):
    """Settings for one property: ``ci`` examples under the ci profile,
    ``fuzz`` under the fuzz profile (each property is priced by what one
    example costs); ``ci=0`` runs only its @example cases under ci."""
    if not FUZZ and ci == 0:  # the explicit @example cases only
        return settings(settings.get_profile(PROFILE), phases=(Phase.explicit,))
    return settings(settings.get_profile(PROFILE), max_examples=fuzz if FUZZ else ci)


# -- the outcome of one command ---------------------------------------------------

ERROR_PREFIX = "orchestrate: error:"
# stderr lines a command may print besides its error: stage progress, and the
# interpreter notice (once per process)
_BENIGN = (
    re.compile(r"  [a-z_]+ +\d+/\d+"),
    re.compile(r"orchestrate: no GPU found; running the Triton kernels in the interpreter .*"),
)


@dataclass
class Outcome:
    args: list[str]
    code: int
    stdout: str
    stderr: str
    exception: BaseException | None

    def __str__(self) -> str:
        return (
            f"orchestrate {' '.join(map(repr, self.args))}\n-> exit {self.code}\n"
            f"stdout: {self.stdout[-1500:]!r}\nstderr: {self.stderr[-1500:]!r}\n"
            f"exception: {self.exception!r}"
        )

    @property
    def error(self) -> str:
        """The error line (or click's "Error:" line of a usage error, F6)."""
        lines = self.stderr.splitlines()
        return next((x for x in lines if x.startswith(ERROR_PREFIX)), None) or next(
            (x for x in lines if x.startswith("Error: ")), ""
        )


def invoke(*args, cwd: Path | None = None) -> Outcome:
    """Run the CLI in this process (click's CliRunner, stdout and stderr apart)."""
    from orchestrate import cli

    argv = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        r = CliRunner().invoke(cli.main, argv, catch_exceptions=True)
    finally:
        os.chdir(old)
    exc = r.exception if not isinstance(r.exception, SystemExit) else None
    return Outcome(argv, r.exit_code, r.stdout, r.stderr, exc)


# Failures already reported (issue 9), by a pattern of the failure's text.
# The ci profile never consults this: a property that fails today is marked
# xfail(strict=True) where it is defined.  ORCHESTRATE_FUZZ_SKIP_KNOWN=1 makes
# `make fuzz` discard examples that hit a known failure, so that it can look
# for new ones while the known ones are being fixed.
# F1-F11, found by this suite, are fixed (issue 9); they live on as
# regressions at the end of test_fuzz.py.  A new find goes here while it is open.
KNOWN: dict[str, str] = {}
SKIP_KNOWN = os.environ.get("ORCHESTRATE_FUZZ_SKIP_KNOWN", "") not in ("", "0")


@contextlib.contextmanager
def known_failures():
    """Under ORCHESTRATE_FUZZ_SKIP_KNOWN, an example that fails in a known
    way is rejected (not counted); otherwise failures pass through."""
    try:
        yield
    except AssertionError as e:
        if SKIP_KNOWN and any(re.search(p, str(e), re.S) for p in KNOWN):
            from hypothesis import reject

            reject()
        raise


def _in_hypothesis() -> bool:
    from hypothesis.control import currently_in_test_context

    return currently_in_test_context()


def check_outcome(out: Outcome, codes: Iterable[int] = (0, 2)) -> None:
    """Exit 0, or exit 2 with exactly one error line; nothing else on
    stderr but progress; never a traceback, never an internal error."""
    codes = tuple(codes)
    if _in_hypothesis():  # the spread of outcomes, in --hypothesis-show-statistics
        event(f"{out.args[0]}: exit {out.code}")
    assert out.exception is None, f"uncaught exception\n{out}"
    assert "Traceback" not in out.stdout + out.stderr, f"a traceback\n{out}"
    assert "internal error" not in out.stderr, f"internal error\n{out}"
    assert out.code in codes, f"exit {out.code}, expected one of {codes}\n{out}"
    # splitlines: every Unicode line terminator ends a line (\r, \x0b, \x0c,
    # \x1c-\x1e, \x85, \u2028, \u2029): an error message must contain none
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith(ERROR_PREFIX)]
    other = [x for x in lines if not x.startswith(ERROR_PREFIX)]
    stray = [x for x in other if not any(p.fullmatch(x) for p in _BENIGN)]
    assert not stray, f"stderr has lines that are neither progress nor the error: {stray}\n{out}"
    if out.code == 0:
        assert not errors, f"exit 0 with an error line\n{out}"
    else:
        assert len(errors) == 1, f"exit {out.code} needs exactly one error line\n{out}"
        assert lines[-1] == errors[0], f"the error line is not the last\n{out}"


# -- file trees ----------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (not following symlinks): kind, mode,
    mtime and content hash of files, target of links."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = os.fspath(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns, _digest(p))
    return out


def changes(before: dict, after: dict) -> set[str]:
    """Entries added, removed or changed between two snapshots."""
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def outside(changed: Iterable[str], allowed: Iterable[str]) -> list[str]:
    """The changed entries that are not an allowed path or under one."""
    allowed = [a.rstrip("/") for a in allowed]
    return sorted(
        c for c in changed if not any(c == a or c.startswith(a + os.sep) for a in allowed)
    )


# -- tiny models -------------------------------------------------------------------

F32 = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


def finish(graph: onnx.GraphProto, opset: int = 17, infer: bool = True) -> onnx.ModelProto:
    """A model of ``graph``; outputs typed by ONNX shape inference where it
    can, else declared float32 of unknown shape (so the checker passes them)."""
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    if infer:
        try:
            m = onnx.shape_inference.infer_shapes(m)
        except Exception:  # noqa: BLE001 - a hostile model: typed below
            pass
    for o in m.graph.output:
        if not o.type.tensor_type.elem_type:
            o.type.tensor_type.elem_type = F32
    return m


@dataclass(frozen=True)
class Names:
    """The names a small model gives its tensors, nodes and graph."""

    x: str = "x"
    w: str = "w"
    t: str = "t"
    y: str = "y"
    z: str = "z"
    mul: str = "mul"
    relu: str = "relu"
    softmax: str = "softmax"
    graph: str = "m"
    doc: str = ""


def named_model(n: Names = Names(), value_info: bool = True) -> onnx.ModelProto:
    """y = relu(x * w), z = softmax(x * w): input x float32[2, 8], initializer
    w float32[8], intermediate t, two outputs."""
    nodes = [
        helper.make_node("Mul", [n.x, n.w], [n.t], name=n.mul, doc_string=n.doc),
        helper.make_node("Relu", [n.t], [n.y], name=n.relu),
        helper.make_node("Softmax", [n.t], [n.z], name=n.softmax, axis=-1),
    ]
    g = helper.make_graph(
        nodes,
        n.graph,
        [helper.make_tensor_value_info(n.x, F32, [2, 8])],
        [
            helper.make_tensor_value_info(n.y, F32, [2, 8]),
            helper.make_tensor_value_info(n.z, F32, [2, 8]),
        ],
        initializer=[numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), n.w)],
        value_info=[helper.make_tensor_value_info(n.t, F32, [2, 8])] if value_info else [],
        doc_string=n.doc,
    )
    return finish(g, infer=False)


def shaped_model(dims: list) -> onnx.ModelProto:
    """y = relu(x), z = reducesum(softmax(x), last axis) over an input of ``dims``
    (ints, or strings for symbolic dimensions; anything, checked or not)."""
    x = helper.make_tensor_value_info("x", F32, None)
    shape = x.type.tensor_type.shape
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d
    nodes = [
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
        helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=-1),
        helper.make_node("ReduceSum", ["s"], ["z"], name="sum", keepdims=0),
    ]
    g = helper.make_graph(
        nodes, "shaped", [x], [onnx.ValueInfoProto(name="y"), onnx.ValueInfoProto(name="z")]
    )
    return finish(g)


def gather_model() -> onnx.ModelProto:
    """The bundle model of the bundle properties.
    y = softmax(x * w) float32[3, 8]; z = table[ids] + 1 float32[4, 8]."""
    inits = [
        numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "w"),
        numpy_helper.from_array(np.arange(80, dtype=np.float32).reshape(10, 8) / 10, "table"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"], name="mul"),
        helper.make_node("Softmax", ["xw"], ["y"], name="softmax", axis=-1),
        helper.make_node("Gather", ["table", "ids"], ["e"], name="gather", axis=0),
        helper.make_node("Add", ["e", "one"], ["z"], name="add"),
    ]
    g = helper.make_graph(
        nodes,
        "gathered",
        [
            helper.make_tensor_value_info("x", F32, [3, 8]),
            helper.make_tensor_value_info("ids", I64, [4]),
        ],
        [onnx.ValueInfoProto(name="y"), onnx.ValueInfoProto(name="z")],
        initializer=inits,
    )
    return finish(g)


def gather_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((3, 8)).astype(np.float32),
        "ids": rng.integers(0, 10, size=4).astype(np.int64),
    }


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every real input of a model with static shapes."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        shape = tuple(d.dim_value for d in tt.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype.kind == "f":
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[i.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feeds


def assert_close(got: dict, want: dict, rtol: float = 1e-4, what: str = "") -> None:
    assert set(got) == set(want), f"{what}: outputs {sorted(got)} != {sorted(want)}"
    for k, w in want.items():
        g = np.asarray(got[k])
        assert g.shape == w.shape and g.dtype == w.dtype, (
            f"{what}: output {k!r}: {g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
        )
        if w.dtype.kind == "f":
            finite = np.abs(w[np.isfinite(w)])
            atol = rtol * float(finite.max()) if finite.size else 0.0
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what}: {k!r}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: {k!r}")


# -- bundles -----------------------------------------------------------------------

BUNDLE_FILES = ("plan.json", "manifest.json", "weights.npz", "kernels.py", "report.md")


def sha256(path: Path) -> str:
    """As orchestrate/bundle/__init__.py hashes a bundle's files."""
    return _digest(path)


def rehash(bundle: Path) -> None:
    """Recompute the manifest's sha256 of every file it lists (as an
    attacker who edits a bundle would), when the manifest still lists them."""
    mpath = bundle / "manifest.json"
    try:
        manifest = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError, OSError):
        return
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return
    for name in list(files):
        if isinstance(name, str) and "/" not in name and (bundle / name).is_file():
            files[name] = sha256(bundle / name)
    mpath.write_text(json.dumps(manifest, indent=1) + "\n")


def json_paths(value, prefix=()) -> list[tuple]:
    """Every path into a JSON document (keys and list indices), the root first."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += json_paths(v, prefix + (i,))
    return out


def json_get(doc, path: tuple):
    for p in path:
        doc = doc[p]
    return doc


def json_set(doc, path: tuple, value):
    """``doc`` with the value at ``path`` replaced (the root when path is ())."""
    if not path:
        return value
    json_get(doc, path[:-1])[path[-1]] = value
    return doc


def json_delete(doc, path: tuple):
    if not path:
        return None
    parent = json_get(doc, path[:-1])
    del parent[path[-1]]
    return doc


def flip(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    """``data`` with byte ``pos % len`` XORed by ``mask`` (1..255) for each flip."""
    b = bytearray(data)
    for pos, mask in flips:
        if b:
            b[pos % len(b)] ^= mask
    return bytes(b)


# every Unicode line terminator Python's str.splitlines knows, and the
# characters that end or escape a Python comment or string
LINE_TERMINATORS = (
    "\n",
    "\r",
    "\r\n",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1d",
    "\x1e",
    "\x85",
    "\u2028",
    "\u2029",
)
SOURCE_BREAKERS = ('"', "'", '"""', "'''", "\\", "#", "{", "}", "%", "\x00", "\t", "\x1b[2J")


def payload(marker: Path) -> str:
    """Python that creates ``marker`` when it runs as a statement."""
    return f"__import__('pathlib').Path({os.fspath(marker)!r}).touch()"
