"""Import ``cosched_node`` from THIS checkout's node_hooks/ (the editable install maps it to the
checkout it was installed from; ``PYTHONPATH=<checkout>`` covers ``condor_sched`` only), so the
in-process node tests exercise the same code as the node programs they run as subprocesses."""
import sys
from pathlib import Path

NODE_HOOKS = str(Path(__file__).resolve().parents[2] / "node_hooks")
if NODE_HOOKS not in sys.path:
    sys.path.insert(0, NODE_HOOKS)
