"""The training loop of the bundled entrypoint and what surrounds it: the loop itself (entry.py,
``Trainer``), the plan as it trains it and what it refuses (config.py), the launch edge (launch.py,
hosts.py), the learning rate (lr_schedule.py), evaluation (validation.py), step records and their sinks
(metrics.py, sinks.py), and the censuses that check the cost model (census.py, schedule_census.py)."""
