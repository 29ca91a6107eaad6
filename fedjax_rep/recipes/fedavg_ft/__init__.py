"""FedAvg with fine-tuning (Collins et al., NeurIPS 2022): its figures.

fig1 (fedavg-ft-fig1), fig3 (fedavg-ft-fig3): the linear theory; neural (fedavg-ft-neural):
Figs. 4-5 left on digits; fig2 (fedavg-ft-fig2), fig5 (fedavg-ft-fig5): Figs. 2 and 5 right,
new clients from another dataset; common: what the linear figures share; compared: the
neural figures' training (FedAvg vs D-SGD); transfer: what fig2 and fig5 share.
"""
