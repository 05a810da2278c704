"""Benchmarks and load generators: scripts that print figures and the machine they ran on (no timed tests)."""
