"""Money: the cost ledger, budgets, burn-rate alerts, notifications and
metrics. Every total a person or a program sees (a job's cost, a team's
spend, a budget's burn) is read from the one ledger (`ledger.py`)."""
