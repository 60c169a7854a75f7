"""Running: the one run pipeline (spec → env → policy → runner → writer), its writers, and the lock and
stored settings of a run's output."""
