"""The kit's version: in every build record, cache key and generated header."""

__version__ = "0.1.0"
