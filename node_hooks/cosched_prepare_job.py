#!/usr/bin/python3 -Es
"""condor_sched's PREPARE_JOB hook (runs as the job's user): cosched_node/prepare_job.py.

Python puts this file's directory first on sys.path, so the cosched_node package next to it
is the one imported; -E ignores PYTHON* variables of the caller's environment.
"""
import sys

from cosched_node.prepare_job import main

sys.exit(main())
