"""One GPU run that brings back the benchmark table (``make bench-gpu``).

run.py          the run: install, prepare, project, steps, files (read it first)
scope.py        the fixed scope and the order of its steps
prepare.py      one model: exported, optimized, counted, compiled ahead
step.py         one runtime of one model, in a child process of its own
projection.py   the time of every step, from the counts
costs.py        the figures the projection takes, each with its source
install.py      what the GPU machine lacks, installed beside what it has
"""
