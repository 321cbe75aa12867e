"""Benchmarks: commands that measure, never tests that assert on wall-clock time."""
