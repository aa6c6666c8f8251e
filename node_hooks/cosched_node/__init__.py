"""condor_sched on the execute node: standard library only, the node's system ``python3``.

One module per concern:

- ``rules``: names and numbers a job may use (shared with the planner, condor_sched)
- ``errors``: exit codes and the errors behind them
- ``ads``: old-syntax ClassAd text (job and machine ads) in and out
- ``config``: the node config (slots, devices, device kinds, sockets)
- ``placement``: compute units of a device (disjoint hardware threads)
- ``environment``: a job's Environment / Env, read as the starter reads it (each variable once)
- ``state``: the agent's root-only state dir, atomic files, the agent's lock, logs
- ``procs``: /proc: start times, a starter's descendants, signals
- ``slots``: the slot view: the startd's own claims (what no job can write)
- ``channel``: the hook-to-agent socket (the peer's credentials name the job)
- ``hook_server``: the agent's main loop and socket server (no caller holds another)
- ``memory_watch``: device memory probes and stopping a job over its allocation
- ``resctrl``: LLC ways and memory bandwidth groups (Spread-n-Share)
- ``runs``: run records of spread jobs (piggyback profiling) and their perf samples
- ``agent``, ``prepare_job``, ``startd_cron``, ``discover``: the programs
"""

#: The release of these programs: condor_sched's own (a test holds them equal). The startd cron
#: advertises it as CoSchedNodeVersion, so ``condor-sched doctor`` finds hosts left behind.
__version__ = "0.1.0"
