"""Side-by-side benchmarks of alchemi against nvalchemi-toolkit, TorchSim and ASE.

``python -m benchmarks`` runs the workloads W1-W6 (W7 and W8 run on their own) with every framework that is
installed, in one process, on the same inputs, and prints per workload a table of speed, memory
and the correctness checks that go with every figure; ``--json`` writes the same as JSON. See
``benchmarks/README.md``.
"""
