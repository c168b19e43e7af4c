"""The vLLM target's own checkers: they read the events only this target emits
(``events.py``: what the fake runner ran, the scheduler's counters) and its fake
model's golden continuation (``golden.py``). ``VllmTarget.checkers`` lists them; the
shared checkers (``invariants``) read the protocol's events beside them.

Modules: ``placeholders`` (vllm-placeholders), ``golden`` (vllm-golden),
``block_reuse`` (vllm-block-reuse), ``preempt_progress`` (vllm-preempt-progress),
``overschedule`` (vllm-overschedule), ``sched_after_end`` (vllm-sched-after-end).
"""
