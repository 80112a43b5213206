"""The package version, in a module of its own so the package's modules can read it without
importing the package's public API (``bayesprism/__init__.py``)."""

__version__ = "0.1.0"
