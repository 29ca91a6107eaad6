"""The papers' recipes, one subpackage a paper (fedrep/, fedavg_ft/, flute/, srpfl/,
centaur/) and digits/: each module registers its figures and tables with
`experiments.recipe_registry`."""
