"""Exact equivalence of a plan and its original, by Mirage's fingerprint:
both evaluated in modular arithmetic at random points (``check.py``).

``field.py`` is the arithmetic, ``fragment.py`` what the check covers,
``evaluate.py`` the primitives in the field, ``check.py`` the comparison and
its false-pass bound, ``bundle.py`` the check of a bundle against its model.
"""

from orchestrate.check.exact.check import TARGET, Kernel, Mismatch, Result, check, kernels_of

__all__ = ["TARGET", "Kernel", "Mismatch", "Result", "check", "kernels_of"]
