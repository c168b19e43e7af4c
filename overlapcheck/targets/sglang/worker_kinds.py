"""The config's spec ``worker`` values (a leaf: the config and the faults both name them).

``fake`` (the deterministic fake, ``worker.py``), or one of SGLang's own spec-v2 worker
classes, run unmodified on a tiny pair (``real_worker.py``): ``eagle-v2``
(EAGLEWorkerV2, Llama target and EAGLE head), ``frozen-kv-mtp-v2`` (FrozenKVMTPWorkerV2,
Gemma4 target and Gemma4 assistant; ``checkpoint``).
"""
WORKERS = ("fake", "eagle-v2", "frozen-kv-mtp-v2")
REAL_WORKERS = WORKERS[1:]
