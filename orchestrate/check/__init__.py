"""Does a bundle compute what the model computes, and will it fit the GPU?

verify.py         random inputs against the float64 truth, onnxruntime beside it
exact/            the plan against fission's graph, exactly, in modular arithmetic
compile_check.py  every kernel compiled for its GPU and held to the device's limits
"""
