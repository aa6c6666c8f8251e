"""Spread-n-Share (paper 000: Section 4, the design): multi-process jobs spread over
sockets by LLC ways and memory bandwidth, sharing nodes where the profiles allow.

``sns.py`` is the paper's scheduler (``sns``, Sections 4.3-4.4), ``sns_global.py`` its joint CP-SAT variant,
``baselines.py`` the paper's CE and CS; ``mode.py`` declares the mode.
"""
