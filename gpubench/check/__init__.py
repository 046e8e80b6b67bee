"""The self-check, `python -m gpubench.check` (suite): rules, plain loops, pipes, cases, cuda."""
