"""The machinery of named experiments (recipes): `recipe_registry` finds them (every module of
the subpackages of `fedjax_rep.recipes` that calls `register`), `config` checks their
configurations, `runner` runs them into `outputs`."""
