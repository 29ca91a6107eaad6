"""Federated datasets: loaders, partitioners and padded per-client arrays."""
