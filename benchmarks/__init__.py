"""LabPortal's benchmarks (``make bench``, ``make bench-json``) and the private Slurm that
they and the Slurm tests start (``benchmarks.local_slurm``).

Not part of the installed product: the wheel leaves this package out (DESIGN.md, "Layout
and layers"). Each module runs as ``python -m benchmarks.<name>`` from a checkout.
"""
