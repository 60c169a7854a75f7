"""Grading: answer normalisation and comparison (QA EM/F1, math equivalence, tool calls).

The leaf layer: pure functions on answers, imported by envs (to grade an episode) and by
rewards (to cluster answers); it imports nothing else from turngym.
"""
