"""BFCL-v0: the Berkeley Function Calling Leaderboard (V4) as a multi-turn gym environment.

``upstream`` imports bfcl-eval safely, ``calls`` decodes and guards model output,
``data`` loads categories, ``execution`` runs calls on bfcl-eval's backend classes,
``env`` is the gymnasium environment, ``score`` the leaderboard's per-category accuracy and V4 overall.
"""
