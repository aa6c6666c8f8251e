"""Paper 004 (overcommitting scheduling, Sections 4-6): how programs slow each other when they
share, measured on a node (``measure``), derived (``dataset``), and learned (``model``): which
pairs must not share. The sharing modes may consult the model; none does yet."""
