"""Device packing (paper 002: Section IV-C, Eq. 1, Fig. 4): jobs that offload to a device
(Xeon Phi, a GPU slot of the ``gpu`` kind) packed onto shared devices by memory and threads.

``capacity.py`` holds the device model every planner uses (capacities, aging, reasons);
``knapsack.py`` is Fig. 4's per-device knapsack, ``global_cpsat.py``, ``lp_pack.py``,
``thread_fill.py`` ours, ``random_packing.py`` and ``exclusive.py`` the paper's baselines;
``bounds.py``, ``columns.py``, ``configurations.py`` and ``neighbourhood.py`` the LPs and
searches behind them; ``mode.py`` declares the mode.
"""
