"""SCRIBE: skill-prototype rubrics checked by a judge, step by step, as per-turn process rewards.

``llm`` (strict-JSON calls), ``decompose`` (steps with character spans inside turns, token-budget
windows), ``embed`` and ``cluster`` (skill grouping), ``library`` (two-level prototypes: skill
families and skills, build, JSON), ``steps`` (hierarchical routing, rubric and open-ended judging),
``scoring`` (step values and per-turn aggregation, shared with ``prm``), ``reward`` (the ``scribe``
reward), ``diagnostics`` (judge reliability), ``dynamics`` (training-dynamics measures).
"""
