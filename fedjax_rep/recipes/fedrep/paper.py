"""FedRep's Table 1 (Collins et al. 2021, Section 5.2): the algorithms it compares, in its
order, and its test accuracies, {(dataset, n, S): {algorithm: accuracy}} (`recipes.kit.table`
puts them beside the measured ones)."""

# The rows of FedRep's Table 1 in its order, then rows the paper does not have (EXTRA:
# FedBABU, a body-only baseline reported beside FedRep by later papers).
PAPER_ALGORITHMS = ("local", "fedavg", "fedavg-ft", "fedprox", "fedprox-ft", "scaffold",
                    "scaffold-ft", "fed-mtl", "per-fedavg", "lg-fedavg", "l2gd", "apfl",
                    "ditto", "fedper", "fedrep")
EXTRA = ("fedbabu",)
DEFAULT_ALGORITHMS = PAPER_ALGORITHMS + EXTRA

# FedRep Table 1 (Collins et al. 2021), test accuracy in %, one column per
# (dataset, n, S); the algorithms in PAPER_ALGORITHMS order.
_COLUMNS = (("cifar10", 100, 2), ("cifar10", 100, 5), ("cifar10", 1000, 2),
            ("cifar100", 100, 5), ("cifar100", 100, 20), ("sent140", 183, 2),
            ("femnist", 150, 3))
_TABLE = (
    (89.79, 70.68, 78.30, 75.29, 41.29, 69.88, 60.86),  # Local only
    (42.65, 51.78, 44.31, 23.94, 31.97, 52.75, 51.64),  # FedAvg
    (87.65, 73.68, 82.04, 79.34, 55.44, 71.92, 72.41),  # FedAvg + FT
    (39.92, 50.99, 21.93, 20.17, 28.52, 52.33, 18.89),  # FedProx
    (85.81, 72.75, 75.41, 78.52, 55.09, 71.21, 53.54),  # FedProx + FT
    (37.72, 47.33, 33.79, 20.32, 22.52, 51.31, 17.65),  # SCAFFOLD
    (86.35, 68.23, 78.24, 78.88, 44.34, 71.49, 52.11),  # SCAFFOLD + FT
    (80.46, 58.31, 76.53, 71.47, 41.25, 71.20, 54.11),  # Fed-MTL
    (82.27, 67.20, 67.36, 72.05, 52.49, 68.45, 71.51),  # Per-FedAvg
    (84.14, 63.02, 77.48, 72.44, 38.76, 70.37, 62.08),  # LG-FedAvg
    (81.04, 59.98, 71.96, 72.13, 42.84, 70.67, 66.18),  # L2GD
    (83.77, 72.29, 82.39, 78.20, 55.44, 69.87, 70.74),  # APFL
    (85.39, 70.34, 80.36, 78.91, 56.34, 71.04, 68.28),  # Ditto
    (87.13, 73.84, 81.73, 76.00, 55.68, 72.12, 76.91),  # FedPer
    (87.70, 75.68, 83.27, 79.15, 56.10, 72.41, 78.56),  # FedRep
)
PAPER = {column: {name: row[j] / 100 for name, row in zip(PAPER_ALGORITHMS, _TABLE)}
         for j, column in enumerate(_COLUMNS)}
