"""The fuzzer: Hypothesis strategies for cases (``strategies``), time-boxed campaigns
(``campaign``, ``jobs``), the ``overlapcheck fuzz`` command and a state machine
(``machine``). Cases run through the one run driver, ``overlapcheck.run``."""
