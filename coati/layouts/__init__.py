"""Micro-batch layouts: how a trainer rank cuts a minibatch into micro-batches and runs each through the model.

One file per layout (``padded.py``, ``rows.py``, ``packed.py``, ``shared.py``), each a ``Layout`` (``base.py``)
owning its cut, its forward, how its logits are read into token logprobs and entropy, and the check that a model
gives the padded step's numbers through it; one row each in ``registry.py`` naming what it needs and what it costs;
one rule (``rule.py``) chooses a run's. This file imports nothing: the rule and the rows are torch-free, for the
plan of ``--dry-run``.
"""
