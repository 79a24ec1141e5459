"""The plan: a layout and its table of axes, the legality rules, the solver, the chosen Plan."""
