"""FedAvg with fine-tuning (Collins et al., NeurIPS 2022): its figures.

fig1 (fedavg-ft-fig1), fig3 (fedavg-ft-fig3): the linear theory; neural (fedavg-ft-neural):
Figs. 4-5 on digits; common: what the linear figures share.
"""
