"""Running mates (paper 001: Section 3.2, Listing 1, SD-Policy): a malleable job starts early as a guest
on the cores a running mate lends it, when that lowers the predicted slowdown.

``cpu_nodes.py`` is the model of whole-node jobs and their runtimes, ``sd.py`` SD-Policy
(Listing 1), ``backfill.py`` the EASY and SLURM backfill baselines; ``live.py`` is the
mode's part of a cycle; ``mode.py`` declares the mode.
"""
