"""Grading: answer normalisation and comparison (QA EM/F1, math equivalence, tool calls), and the
metrics of graded episodes with their intervals (``metrics``).

The leaf layer: pure functions on answers and outcomes, imported by envs (to grade an episode), by
rewards (to cluster answers) and by training and evals (to summarise outcomes); it imports nothing
else from turngym but the episode records.
"""
