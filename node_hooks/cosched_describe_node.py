#!/usr/bin/python3 -Es
"""condor_sched's node describer: writes this node's node config: cosched_node/describe.py.

Run as root with the node's system python3. Python puts this file's directory first on
sys.path, so the cosched_node package next to it is the one imported; -E ignores PYTHON*
variables of the caller's environment.
"""
import sys

from cosched_node.describe import main

sys.exit(main())
