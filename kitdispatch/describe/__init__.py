"""Describe kernels: names, types, index expressions, parameters, kernels, modules, the manifest,
the C signature and the build record. Imports nothing of the other stages."""
