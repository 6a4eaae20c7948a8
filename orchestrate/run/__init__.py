"""Running a plan: the Program (buffers by liveness, kernels in order, CUDA
graphs; ``runtime.py``) and a range of shapes' Programs (``ranged.py``)."""
