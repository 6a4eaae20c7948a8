"""A range bundle loaded and run at any binding of its dimensions.

``load_dynamic`` prints the kernels again from plan.json and dims.json
(``plan/ranged.py``) and compares them with the shipped kernels.py, as
``api.load`` does for a static bundle; the :class:`DynamicBundle` it returns
runs through one :class:`DynamicProgram`.

The kernels module is one for the whole range: it is loaded once, and each
kernel is compiled once (Triton specializes a dimension that is 1 or a
multiple of 16, so a few variants at most).  A run reads the binding off the
inputs' shapes, checks it (every input agrees on each dimension, each
dimension inside its declared range: otherwise a one-line InputError that
names the input and the dimension), and runs the :class:`runtime.Program`
of that binding.

Buffers grow on demand: each binding seen gets its own Program, with its
own pooled buffers and, on a GPU, its own CUDA graph (captured at its second
run, as for a static bundle).  A CUDA graph replays fixed addresses, so the
buffers of a captured shape must stay where they were; one pool sized for
MAX would hold the largest shape's memory for every shape and still need a
graph per shape.  The Programs of the ``cache`` most recently used bindings
are kept (least recently used dropped first, its buffers and graph freed),
so memory is bounded by ``cache`` shapes' buffers, and a workload cycling
through a few shapes replays graphs without recapturing.  The weights are
not a shape's: each stored constant becomes a tensor (on the device) once,
for the first Program that needs it, and every later Program uses that one;
only the constants cut or computed for a binding are its Program's own.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from orchestrate import bundle, text
from orchestrate.errors import InputError
from orchestrate.frontend.decode import decode_io
from orchestrate.plan import Plan
from orchestrate.plan.ranged import instance, regenerate_ranged
from orchestrate.run import generate
from orchestrate.run.runtime import (
    IndexChecks,
    Program,
    check_runnable,
    gpu_available,
    load_kernels,
)
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.family import Binding, Family
from orchestrate.shapes.poly import Poly

DEFAULT_CACHE = 8  # bindings whose Program (buffers, CUDA graph) is kept


def _solved(family: Family, p: Poly, v: int, where: str) -> tuple[int, int] | None:
    """(the dimension, its value) that an axis of formula ``p`` and length
    ``v`` gives, where ``p`` is one dimension times a whole number plus a
    constant (``past``, ``past + 1``, ``2*s0``); None for any other formula
    (those are checked by the Program against the binding the others give).
    InputError (naming ``where``) for a length no value of the dimension gives."""
    terms = p.linear
    if terms is None or len(terms) != 1:
        return None
    (name, coeff), rest = terms[0], v - p.const
    if rest % coeff:
        raise InputError(f"{where} is {v}: no whole {name} makes {p} that")
    return family.names.index(name), rest // coeff


def binding_of(family: Family, shapes: Mapping[str, tuple[int, ...]]) -> Binding:
    """The binding the inputs' shapes give; InputError for inputs that
    disagree on a dimension or lie outside its range.  (Other shape errors
    are the Program's, which checks every input against the binding.)"""
    seen: dict[int, tuple[int, str]] = {}  # dim -> (value, the input and axis giving it)
    for name, polys in family.inputs.items():
        shape = shapes.get(name)
        if shape is None:
            raise InputError(f"missing input {name!r}")
        if len(shape) != len(polys):
            raise InputError(f"input {name!r}: rank {len(shape)}, expected {len(polys)}")
        for axis, p in enumerate(polys):
            bare = p.linear is not None and len(p.linear) == 1 and p == Poly.of(p.linear[0][0])
            axis_of = f"input {name!r}: axis {axis}" + ("" if bare else f" ({p})")
            solved = _solved(family, p, int(shape[axis]), axis_of)
            where = axis_of + (" is" if bare else " gives")
            if solved is None:
                continue
            k, v = solved
            dim = family.dims[k]
            if k in seen and seen[k][0] != v:
                raise InputError(
                    f"{where} {dim.shown}={v}, but {seen[k][1]} {dim.shown}={seen[k][0]}"
                )
            seen.setdefault(k, (v, where))
    missing = [d.name for k, d in enumerate(family.dims) if k not in seen]
    if missing:  # pragma: no cover - binding.py gives every dimension an input axis
        raise InputError(f"no input gives dimension {missing[0]!r}")
    for k, (v, where) in sorted(seen.items()):
        r = family.dims[k].range
        if v not in r:
            raise InputError(
                f"{where} {family.dims[k].shown}={v}, outside the bundle's range {r.min}..{r.max}"
            )
    return tuple(seen[k][0] for k in range(len(family.dims)))


def binding_of_inputs(family: Family, inputs: Mapping[str, object]) -> Binding:
    """``binding_of`` the shapes of ``inputs`` (arrays or tensors by name)."""
    if not isinstance(inputs, Mapping):
        raise InputError(
            f"inputs: expected a dict of arrays by input name, got {type(inputs).__name__}"
        )
    return binding_of(family, {k: tuple(np.shape(v)) for k, v in inputs.items()})


class DynamicProgram:
    """A dynamic plan's Programs, one per binding in use (see the module doc)."""

    def __init__(
        self,
        plan: Plan,
        family: Family,
        constants: Mapping[str, np.ndarray],
        kernels_module,
        source: str,
        *,
        interpret: bool,
        cuda_graph: bool = True,
        cache: int = DEFAULT_CACHE,
        resident: dict[int, tuple[np.ndarray, object]] | None = None,
    ):
        if not isinstance(cache, int) or isinstance(cache, bool) or cache < 1:
            raise InputError(f"cache={cache!r}: expected a number of shapes >= 1")
        self.plan, self.family, self.constants = plan, family, constants
        self.module, self.source = kernels_module, source
        self.interpret, self.cuda_graph, self.cache = interpret, cuda_graph, cache
        self._programs: OrderedDict[Binding, Program] = OrderedDict()
        # each stored constant as a tensor, made by the first Program that
        # needs it and used by every later one (one copy of the weights), by
        # the identity of its array, which the entry keeps alive; a decode
        # step's in-place bundle shares the outer bundle's (same arrays)
        self._resident = {} if resident is None else resident
        self._lock = threading.Lock()
        self.made = 0  # Programs made (a binding seen again after eviction counts again)

    def program(self, binding: Binding) -> Program:
        with self._lock:
            found = self._programs.get(binding)
            if found is not None:
                self._programs.move_to_end(binding)
                return found
        inst = instance(self.plan, self.family, self.constants, binding, self.source)
        codes = dict(zip(self.family.codes, binding))
        # the stored constants, not those cut or computed for this binding
        stored = {k: v for k, v in inst.graph.constants.items() if v is self.constants.get(k)}
        shared = {k: self._resident[id(v)][1] for k, v in stored.items() if id(v) in self._resident}
        made = Program(
            inst.planned,
            inst.graph,
            self.module,
            interpret=self.interpret,
            cuda_graph=self.cuda_graph,
            indices=IndexChecks(inst.graph, inst.planned),
            dims=codes,
            shared=shared,
        )
        with self._lock:
            self.made += 1
            for k, v in stored.items():
                self._resident.setdefault(id(v), (v, made.constants[k]))
            self._programs[binding] = made
            while len(self._programs) > self.cache:
                self._programs.popitem(last=False)
        return made

    def check_inputs(self, inputs: Mapping[str, object]) -> None:
        """InputError for inputs outside the range or not agreeing with each
        other, or any error the binding's Program finds."""
        self.program(binding_of_inputs(self.family, inputs)).check_inputs(inputs)

    def run(
        self, inputs: Mapping[str, object], resident: frozenset[str] = frozenset()
    ) -> dict[str, object]:
        return self.program(binding_of_inputs(self.family, inputs)).run(inputs, resident)

    @property
    def cached(self) -> tuple[Binding, ...]:
        """The bindings whose Programs are kept, least recently used first."""
        return tuple(self._programs)


class DynamicBundle:
    """A loaded dynamic bundle: ``run(inputs)`` at any shape in its range.
    ``dims`` gives each dimension's range; ``inputs`` the input shapes at OPT."""

    def __init__(
        self,
        path: Path,
        manifest: dict,
        plan: Plan,
        family: Family,
        constants,
        source: str,
        interpret: bool | None,
        resident: dict[int, tuple[np.ndarray, object]] | None = None,
    ):
        self.path, self.manifest, self.plan, self.family = path, manifest, plan, family
        self.interpret = (not gpu_available()) if interpret is None else interpret
        self._constants, self._source = constants, source
        self._resident = {} if resident is None else resident  # DynamicProgram's
        self._program: DynamicProgram | None = None
        self._in_place: DynamicBundle | None = None
        self._making = threading.Lock()

    @property
    def graph(self):
        """The primitive graph at OPT."""
        return self.graph_at(self.family.at("opt"))

    def graph_at(self, binding: Binding):
        """The primitive graph at ``binding`` (``bench`` prices the shape it times)."""
        return instance(self.plan, self.family, self._constants, binding, str(self.path)).graph

    @property
    def dims(self) -> dict[str, DimRange]:
        return {d.name: d.range for d in self.family.dims}

    @property
    def program(self) -> DynamicProgram:
        with self._making:  # threads that run first make one, not several
            if self._program is None:
                opt = instance(
                    self.plan, self.family, self._constants, self.family.at("opt"), str(self.path)
                )
                check_runnable(opt.graph, self.interpret, opt.planned.specs)
                module = load_kernels(self._source, self.interpret)
                self._program = DynamicProgram(
                    self.plan,
                    self.family,
                    self._constants,
                    module,
                    str(self.path),
                    interpret=self.interpret,
                    resident=self._resident,
                )
        return self._program

    def binding(self, inputs: Mapping[str, object]) -> Binding:
        """The binding of the dimensions the inputs give (InputError outside the range)."""
        return binding_of_inputs(self.family, inputs)

    def check_inputs(self, inputs: Mapping[str, object]) -> None:
        """InputError for inputs outside the range, disagreeing on a
        dimension (both before anything is loaded), or refused by the
        binding's Program (dtype, indices)."""
        self.binding(inputs)
        self.program.check_inputs(inputs)

    def run(
        self, inputs: Mapping[str, object], resident: frozenset[str] = frozenset()
    ) -> dict[str, object]:
        """As ``Bundle.run``, at the binding the inputs' shapes give
        (``resident``: see ``Program.run``)."""
        self.binding(inputs)  # before anything is loaded: outside the range is refused
        return self.program.run(inputs, resident)

    @property
    def inputs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {i.name: (i.shape, i.dtype) for i in self.plan.graph.inputs}

    def decoding(self):
        """The decode interface, each cache's growing axis, and the range of
        past lengths (``run/generate.py``)."""
        io = decode_io(list(self.inputs), self.outputs, str(self.path))
        shapes, pasts = {}, set()
        for past, _ in io.caches:
            polys = self.family.inputs.get(past, ())
            grows = [i for i, p in enumerate(polys) if not p.is_const]
            if len(grows) != 1:
                raise InputError(
                    f"{self.path}: cache input {text.shown(past)} has {len(grows)} dynamic axes; "
                    "a decode step's cache grows along one"
                )
            axis = grows[0]
            shapes[past] = (self.inputs[past][0], axis, self.inputs[past][1])
            pasts.add(polys[axis])
        if len(pasts) != 1:
            raise InputError(f"{self.path}: the caches do not share one past length")
        (length,) = pasts
        least, most = length.bounds({d.name: d.range for d in self.family.dims})
        return io, shapes, least, most

    def in_place(self) -> DynamicBundle | None:
        """The decode step over caches kept in place (``bundle.IN_PLACE``),
        checked against the hash this bundle's manifest holds; None for a
        bundle without one."""
        field = self.manifest.get("in_place")
        if field is None:
            return None
        with self._making:
            if self._in_place is None:
                folder = self.path / bundle.IN_PLACE
                # the weights it shares with this bundle are this bundle's arrays
                contents = bundle.read(folder, outer=self._constants)
                if bundle.sha256(folder / "manifest.json") != field["manifest"]:
                    raise InputError(
                        f"{folder}: manifest.json is not the one {self.path}/manifest.json names "
                        "(the in-place step was replaced or changed); optimize the model again"
                    )
                self._in_place = load_dynamic(folder, contents, self.interpret, self._resident)
        return self._in_place

    def generate(
        self,
        prompt_ids,
        max_new_tokens: int,
        *,
        sample: bool = False,
        seed: int = 0,
        temperature: float = 1.0,
        in_place: bool = True,
        prefill: DynamicBundle | None = None,
    ) -> generate.Generated:
        """Tokens after ``prompt_ids``: greedy, or sampled with ``seed`` at
        ``temperature`` (``orchestrate/run/generate.py``); over the in-place
        step where the bundle has one and ``in_place``, else over the
        graph's own step, the caches fed back. ``prefill``: a loaded bundle
        of the prompt step (``check_prefill``), which runs the prompt at once."""
        io, shapes, least, most = self.decoding()
        if prefill is not None:
            self.check_prefill(prefill, io, shapes, least)
        device = "cpu" if self.interpret else "cuda"
        step = self.in_place() if in_place else None
        if step is not None:
            field = self.manifest["in_place"]
            rows, bucket = field["capacity"], field["bucket"]
            caches = generate.caches_for(io, shapes, rows, least, device, bucket, most)
            buffers = frozenset(caches.buffers)
            run = lambda feed: step.run(feed, resident=buffers)  # noqa: E731
        else:
            run, caches = self.run, generate.caches_for(io, shapes, None, least, device)
        return generate.generate(
            run,
            io,
            caches,
            [int(t) for t in prompt_ids],
            max_new_tokens,
            least_past=least,
            most_past=most,
            sample=sample,
            seed=seed,
            temperature=temperature,
            prefill=None if prefill is None else prefill.run,
        )

    def check_prefill(self, prefill, io, shapes, least: int) -> None:
        """InputError unless ``prefill`` is a bundle of the prompt step for
        this decode step: the same inputs and outputs, its caches at the
        decode range's least past length (where the decode steps go on)."""
        where = f"--prefill {getattr(prefill, 'path', prefill)}"
        if not isinstance(prefill, DynamicBundle):
            raise InputError(f"{where}: not a bundle made for a range of prompt lengths")
        if (list(prefill.inputs), prefill.outputs) != (list(self.inputs), self.outputs):
            raise InputError(f"{where}: its inputs and outputs are not the decode step's")
        for past, _ in io.caches:
            polys = prefill.family.inputs.get(past, ())
            dynamic = [str(p) for p in polys if not p.is_const]
            rows = prefill.inputs[past][0][shapes[past][1]]
            if dynamic or rows != least:
                raise InputError(
                    f"{where}: its cache {text.shown(past)} holds "
                    f"{' '.join(dynamic) or rows} rows; the decode steps start at {least} "
                    f"(optimize the prompt step with --dim past={least})"
                )

    def token_bytes(self, in_place: bool = True) -> generate.TokenBytes:
        """Bytes one step moves at OPT, predicted (by the in-place step's plan
        where the bundle has one and ``in_place``), against the floor."""
        step = self.in_place() if in_place else None
        plan, constants = (
            (self.plan, self._constants) if step is None else (step.plan, step._constants)
        )
        io, shapes, _, _ = self.decoding()
        opt = self.family.at("opt")
        at_opt = {past: self.family.input_shape(past, opt) for past in shapes}
        caches = {
            past: math.prod(at_opt[past]) * np.dtype(dtype).itemsize
            for past, (_, _, dtype) in shapes.items()
        }
        first = io.caches[0][0]
        return generate.token_bytes(plan, constants, caches, at_opt[first][shapes[first][1]])

    @property
    def outputs(self) -> list[str]:
        return list(self.plan.graph.outputs)


def load_dynamic(
    out_dir: Path,
    contents: bundle.Contents,
    interpret: bool | None,
    resident: dict[int, tuple[np.ndarray, object]] | None = None,
) -> DynamicBundle:
    """The dynamic bundle in ``contents``, its kernels printed again and
    compared with the shipped kernels.py (as ``api.load``); ``resident``: the
    constants' tensors it shares with another bundle (``DynamicProgram``)."""
    family = Family.from_json(contents.dims, f"{out_dir}/{bundle.DIMS}")
    mismatch = family.stored_mismatch(contents.constants)
    if mismatch is not None:  # a re-hashed dims.json claiming a range beyond what was built
        raise InputError(
            f"{out_dir}: dims.json does not describe the bundle's weights.npz ({mismatch}); "
            "optimize the model again for that range"
        )
    made = regenerate_ranged(
        contents.plan, family, contents.constants, contents.manifest["model"]["file"], str(out_dir)
    )
    if made.source != contents.kernels_py:
        raise InputError(
            f"{out_dir}: kernels.py is not the source orchestrate generates from "
            "plan.json and dims.json (the bundle was edited, or written by another "
            "version); optimize the model again"
        )
    return DynamicBundle(
        out_dir,
        contents.manifest,
        contents.plan,
        family,
        contents.constants,
        made.source,
        interpret,
        resident,
    )
