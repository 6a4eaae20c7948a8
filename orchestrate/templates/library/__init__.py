"""The library templates: a matmul, a convolution or attention run by a call
into torch (cuBLAS, cuDNN, SDPA) in place of generated Triton; their cost
terms, with the library's own efficiency figures, are ``templates/library/cost.py``'s."""

from __future__ import annotations

from orchestrate.cost import terms
from orchestrate.cost.devices import Device
from orchestrate.ir import Graph
from orchestrate.kernels.spec import KernelSpec
from orchestrate.templates.base import Template
from orchestrate.templates.library import rule as rules
from orchestrate.templates.library.cost import library_flops, library_terms
from orchestrate.templates.library.emit import library


def _terms(graph: Graph, spec: KernelSpec, device: Device) -> tuple:
    read, written = terms.read_bytes(graph, spec), terms.write_bytes(graph, spec.outputs)
    return library_terms(graph, spec, device, read, written)


TEMPLATES = tuple(
    Template(rule, library, flops=library_flops, terms=_terms)
    for rule in (rules.MATMUL_RULE, rules.CONV_RULE, rules.ATTENTION_RULE)
)
