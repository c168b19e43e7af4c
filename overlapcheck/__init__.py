"""overlapcheck: deterministic testing and fuzzing of overlap-scheduled speculative
decoding engines."""
__version__ = "0.1.0"
