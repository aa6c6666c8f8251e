#!/usr/bin/python3 -Es
"""condor_sched's STARTD_CRON job (runs as condor): cosched_node/startd_cron.py.

Python puts this file's directory first on sys.path, so the cosched_node package next to it
is the one imported; -E ignores PYTHON* variables of the caller's environment.
"""
import sys

from cosched_node.startd_cron import main

sys.exit(main())
