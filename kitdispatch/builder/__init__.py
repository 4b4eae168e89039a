"""Build: options, the pipeline from description to .vmfb, and publishing into output folders."""
