"""FLUTE (Liu et al., ICML 2024): its figures and table.

fig1 (flute-fig1), fig3 (flute-fig3), fig4 (flute-fig4): the linear under-parameterised
experiments; table1 (flute-table1): Table 1 on CIFAR partitions; common: what the figures
share.
"""
