"""Linear shared-representation problems and algorithms."""
