"""Measured costs: ``optimize --tune`` times kernels on the GPU and remembers it.

    tuner.py    for each distinct spec, its best few configurations under the
                cost model timed (cache first); the prices the plan is solved with
    timer.py    the Timer protocol, and FakeTimer (tests, the dry benchmark)
    gpu.py      GpuTimer: one spec's kernel alone, compiled ahead in parallel,
                timed by triton.testing.do_bench
    cache.py    the SQLite measurement cache in the user's cache directory
    records.py  what a measurement record holds (schema); export.py: ``records export``

How measurements replace the model, and scale what was not measured, is
``cost/measured.py``.
"""

from orchestrate.tune.timer import FakeTimer, Timer, TimerInfo
from orchestrate.tune.tuner import Tune, Tuned, tune

__all__ = ["FakeTimer", "Timer", "TimerInfo", "Tune", "Tuned", "tune"]
