#!/usr/bin/python3 -Es
"""condor_sched's node agent (root, a daemon of the execute node's condor_master): cosched_node/agent.py.

Python puts this file's directory first on sys.path, so the cosched_node package next to it
is the one imported; -E ignores PYTHON* variables of the caller's environment.
"""
import sys

from cosched_node.agent import main

sys.exit(main())
