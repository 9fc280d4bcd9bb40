"""Benchmarks: scripts that print tables (not tests). See bench/README.md."""
