"""Drive IREE's tools: find them, run iree-compile with the kit's flags."""
