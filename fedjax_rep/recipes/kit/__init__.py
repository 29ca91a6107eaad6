"""The kit the recipes share: linear and neural configuration fields and data
(`linear`, `neural`; a registered dataset partitioned over clients: `partitioned`), seeds,
keys, trained runs and metrics.csv rows (`shared`), the neural
summaries and statistics (`summaries`), the Table-1 comparisons (`table`). The framework
that runs any recipe is `fedjax_rep.experiments`."""
