"""The self-check users run on their own machine: `python -m gpubench.check [overrides]`: the
command (`suite`), every PASS/FAIL rule (`rules`), the reference loops (`plain`), gpubench's
phases against them (`pipes`), the known-answer verdicts (`cases`), NVML and peak (`cuda`)."""
