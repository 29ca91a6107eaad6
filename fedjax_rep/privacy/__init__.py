"""Differential privacy of a federated run: its user-level (epsilon, delta) accounting."""
