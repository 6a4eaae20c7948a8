"""A loaded range bundle: one bundle for every shape in its range.

    model = orchestrate.load("model.orch")      # a DynamicBundle when it has dims.json
    model.run({"input_ids": ids})               # any shape in the range

``api.load`` comes here for a bundle with dims.json: its kernels are printed
again from plan.json and dims.json (``plan/ranged.py``) and compared with
the shipped kernels.py; the runner is ``run/ranged.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from orchestrate import bundle
from orchestrate.errors import InputError
from orchestrate.plan import Plan
from orchestrate.plan.ranged import instance, regenerate_ranged
from orchestrate.run.ranged import DynamicProgram, binding_of_inputs
from orchestrate.run.runtime import check_runnable, gpu_available, load_kernels
from orchestrate.shapes.dims import DimRange
from orchestrate.shapes.family import Binding, Family

__all__ = ["DynamicBundle", "load_dynamic"]


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
    ):
        self.path, self.manifest, self.plan, self.family = path, manifest, plan, family
        self.interpret = (not gpu_available()) if interpret is None else interpret
        self._constants, self._source = constants, source
        self._program: DynamicProgram | None = None
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

    def run(self, inputs: Mapping[str, object]) -> dict[str, object]:
        """As ``Bundle.run``, at the binding the inputs' shapes give."""
        self.binding(inputs)  # before anything is loaded: outside the range is refused
        return self.program.run(inputs)

    @property
    def inputs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {i.name: (i.shape, i.dtype) for i in self.plan.graph.inputs}

    @property
    def outputs(self) -> list[str]:
        return list(self.plan.graph.outputs)


def load_dynamic(out_dir: Path, contents: bundle.Contents, interpret: bool | None) -> DynamicBundle:
    """The dynamic bundle in ``contents``, its kernels printed again and
    compared with the shipped kernels.py (as ``api.load``)."""
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
    )
