"""The crawler's benchmark: ``python -m bench`` (see bench/README.md)."""
