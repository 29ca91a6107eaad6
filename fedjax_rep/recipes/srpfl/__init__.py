"""SRPFL (Tziotis et al., TMLR 2023): straggler-resilient doubling on a simulated wall clock.

linear (srpfl-linear), speedup (srpfl-speedup): the linear theory; neural (srpfl-neural):
the neural-network experiments; common: the clock, the targets and the runs they share.
"""
