"""crashdrill: crash-test training runs and prove the resume is bit-identical."""

__version__ = "0.1.0"
