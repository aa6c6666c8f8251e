"""Spread-n-Share (paper 000: Section IV, Algorithm 1): multi-process jobs spread over
sockets by LLC ways and memory bandwidth, sharing nodes where the profiles allow.

``sns.py`` is Algorithm 1 (``sns``), ``sns_global.py`` its joint CP-SAT variant,
``baselines.py`` the paper's CE and CS; ``mode.py`` declares the mode.
"""
