"""Benchmarks that run RandKV and its baselines side by side in one invocation."""
