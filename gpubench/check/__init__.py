"""The self-check users run on their own machine: `python -m gpubench.check [overrides]`.

`suite` (the command, the order of the checks), `rules` (every PASS/FAIL rule, pure functions of
measured figures), `plain` (the reference training step and loader loop, written as a user's
loop is), `pipes` (compute and loader: gpubench's phase against the plain loop, alternated),
`cases` (the verdict on two runs whose narrowest pipe is known), `cuda` (NVML, the peak table,
the window's timing; CUDA only).
"""
