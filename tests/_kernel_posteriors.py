"""Kept for tests/test_composition_regressions.py (owned elsewhere): use posterior_builders."""

from posterior_builders import gemm_only, kernel_posterior

__all__ = ["gemm_only", "kernel_posterior"]
