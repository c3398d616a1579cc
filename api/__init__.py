"""spotbroker REST API (FastAPI)."""
