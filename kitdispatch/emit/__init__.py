"""Emit MLIR: the module IREE compiles, rendered from mlir_templates/."""
