"""mr2probe: linear-probing benchmarks of frozen encoders, with MR2 and its baselines, per-class."""
__version__ = "0.1.0"

_LAZY = {"ProbeClassifier": "estimator", "MR2Classifier": "estimator",  # name -> submodule (imported on use)
         "load_results": "table", "summarize": "table"}


def __getattr__(name: str) -> object:
    """``mr2probe.ProbeClassifier`` / ``mr2probe.MR2Classifier`` / ``mr2probe.load_results`` /
    ``mr2probe.summarize`` without importing torch/sklearn/pandas at ``import mr2probe``."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
