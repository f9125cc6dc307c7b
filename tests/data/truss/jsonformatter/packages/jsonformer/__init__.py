"""Stand-in for jsonformer (see ../README.md)."""
