"""The deployment's totals on /metrics, read from the database by the one
broker holding the `metrics` lease (each process's own: api/http_metrics.py)."""
