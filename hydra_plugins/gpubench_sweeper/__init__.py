"""gpubench's Hydra sweeper plugin (`hydra/sweeper=gpubench`): Optuna ask/tell under a memory ceiling."""
