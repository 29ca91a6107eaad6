"""The offline demo: personalised FL on scikit-learn's digits.

personalized (digits-personalized): every neural algorithm of the registry, test accuracy
vs rounds.
"""
