"""System heterogeneity: client speed models, a virtual wall clock, the SRPFL schedule."""
