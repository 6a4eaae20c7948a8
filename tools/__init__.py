"""Scripts that are not examples: the one GPU run (``tools.bench_gpu``)."""
