"""The dashboard in the browser: server-rendered pages of a team's money (routes.py)."""
