"""Kept for the fit/io/CLI tests owned elsewhere (test_fit_cli, test_inference, test_io): the
tiny trace table and its shared fit live in posterior_builders."""

from posterior_builders import GPU_EFFECT, fitted, tiny_kernel_table, tiny_spec

__all__ = ["GPU_EFFECT", "fitted", "tiny_kernel_table", "tiny_spec"]
