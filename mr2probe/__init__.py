"""mr2probe: linear-probing benchmarks of frozen encoders, with MR2 and its baselines, per-class."""
__version__ = "0.1.0"
