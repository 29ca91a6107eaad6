"""FedRep (Collins et al., ICML 2021): its figures and tables.

fig1 (fedrep-fig1), fig3 (fedrep-fig3), fig4 (fedrep-fig4): the linear experiments of
Section 5.1; table1 (fedrep-table1-cifar10, -cifar100, -femnist, -sent140) and
table1_synthetic (table1-synthetic): Table 1 of Section 5.2; fig5 (fedrep-fig5): local
epochs; fig6 (fedrep-fig6): new clients from another dataset.
"""
