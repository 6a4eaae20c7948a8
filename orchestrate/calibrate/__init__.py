"""``orchestrate calibrate``: the cost model against published GPU measurements.

Every measurement row (``data/measurements/``, ``cost/measurements.py``) is
predicted as ``predict.py`` says, and the predictions are set against the
measured times per GPU and runtime, and per GPU, runtime and kind of
program: the geometric-mean ratio, the typical error factor, Spearman's rank
correlation and the share within 2x (``stats.py``).  Eager rows are set
against the model's unfused, library-only plan (what PyTorch runs op by
op); torch.compile rows against the model's own plan (fused kernels, as
Inductor fuses).  A scatter plot of predicted against measured is drawn
when matplotlib is installed (``report.py``).
"""

from __future__ import annotations

from orchestrate.calibrate.harness import runtime_class
from orchestrate.calibrate.predict import Prediction, Skipped, predict, predict_all
from orchestrate.calibrate.report import Table, table, text

__all__ = [
    "Prediction",
    "Skipped",
    "Table",
    "predict",
    "predict_all",
    "runtime_class",
    "table",
    "text",
]
