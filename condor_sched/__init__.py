"""condor_sched: a co-scheduler for HTCondor pools."""
__version__ = "0.1.0"
