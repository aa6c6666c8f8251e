"""Paper 003 (Sections III-A, III-B, IV-B): spare-capacity jobs (``+CoSchedSpare = true``) run
in what a node's primary jobs measurably leave idle, as its node agent's Bag of Little
Bootstraps estimates it, confined under cgroup limits, in the node's overlapping SPARE slot."""
