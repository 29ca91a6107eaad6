"""CENTAUR (Shen et al., ICLR 2023): private FedRep under user-level DP.

tradeoff (centaur-tradeoff): test accuracy against ε for CENTAUR, DP-FedAvg-FT and local
only, on digits.
"""
