"""Kernels inside models: import, match ops to kernels, build, compare."""
