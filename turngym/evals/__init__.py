"""Evals: the eval job (``turngym eval``: a model on an env and dataset subset, its results, report and
viewer; sharded runs merged) and the main job (evals on every env, reward ablation and creditbench in one run)."""
