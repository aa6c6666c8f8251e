"""A real HTCondor pool on this machine: minicondor in a cached Debian sid chroot.

One condor_master runs the central manager, a schedd and one startd per inventory node
(local names NODE1, NODE2, ...), all on 127.0.0.1 with CLAIMTOBE authentication: a test
pool, never a model for production security. ``condor-sched pool up|down|status`` and
the integration tests use it.
"""
from condor_sched.localpool.chroot import PoolError
from condor_sched.localpool.config import DOMAIN
from condor_sched.localpool.pool import (PoolInfo, PoolSettings, build, client_config_path, client_env, down,
                                         set_second_schedd, set_sidecar, status, up)

__all__ = ["DOMAIN", "PoolError", "PoolInfo", "PoolSettings", "build", "client_config_path", "client_env",
           "down", "set_second_schedd", "set_sidecar", "status", "up"]
