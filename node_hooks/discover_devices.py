#!/usr/bin/python3 -Es
"""condor_sched's device discovery: prints the node's slot configuration: cosched_node/discover.py.

Python puts this file's directory first on sys.path, so the cosched_node package next to it
is the one imported; -E ignores PYTHON* variables of the caller's environment.
"""
import sys

from cosched_node.discover import main

sys.exit(main())
