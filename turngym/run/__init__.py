"""Running: the one run pipeline (spec → env → policy → runner → writer), the outputs it claims (``outputs.py``:
the writers), and the lock and stored settings of a run's output."""
