"""The sharing modes, one package per paper (``docs/architecture.md``):

* ``devices/``: paper 002, device knapsack packing (knapsack, global, lp-pack, thread-fill, even-drain,
  random, exclusive, their bounds and solvers);
* ``gpus/``: paper 002 on MPS, GPU shares on a fleet view (FGD and its baselines, fgd-mem);
* ``spread/``: paper 000, Spread-n-Share by LLC ways and memory bandwidth (sns, sns-global,
  ce, cs);
* ``mates/``: paper 001, slowdown-driven co-scheduling with running mates (sd, backfill,
  slurm-*).

``planning.py`` is the planner interface they share, ``interface.py`` what a mode declares,
``registry.py`` the one list of modes through which everything finds a mode or planner by
name. This package's ``__init__`` imports nothing, so no module imports it in a circle.
"""
