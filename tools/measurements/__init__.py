"""Published GPU measurements turned into rows the cost model can be checked against.

``python -m tools.measurements.kernelbench KBREPO --out FILE`` reads the timing
files of a KernelBench git mirror, exports each timed program at its published
size and writes one row per (GPU, runtime, program, sizes) in the format
``orchestrate.cost.measurements`` loads (data/measurements/README.md).

* ``history``: which commit's timing file and problem files go together;
* ``export``: one program exported to a shape-only ONNX file, in its own process;
* ``describe``: an ONNX model as the JSON graph description rows carry.
"""
