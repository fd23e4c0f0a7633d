"""``dsv4kit eval``: does the served model still answer right (docs/quality.md).

Standard library only at the top level of every module that is copied to the box
(``prompts.py``, ``box_eval.py``).
"""
