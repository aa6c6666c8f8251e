"""GPU shares (paper 002's packing on today's GPUs through MPS): jobs asking for a share of
a GPU's compute and memory, placed on a fleet view of the GPU nodes.

``fleet.py`` is the fleet, ``fleet_policy.py`` the fleet planners' interface and what they
share; ``fgd*.py`` and ``baselines.py`` follow Weng et al., USENIX ATC '23 (FGD) and its
published baselines; ``on_devices.py`` runs the device mode's planners on one device slot
per GPU; ``live.py`` is the mode's part of a cycle; ``mode.py`` declares the mode.
"""
