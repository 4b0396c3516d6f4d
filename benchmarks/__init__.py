"""Side-by-side benchmarks of alchemi against nvalchemi-toolkit, TorchSim and ASE.

``python -m benchmarks`` runs the workloads of BENCHMARKS.md (W1-W6) with every framework that is
installed, in one process, on the same inputs, and prints per workload a table of speed, memory
and the correctness checks that go with every figure; ``--json`` writes the same as JSON. See
``benchmarks/README.md``.
"""
