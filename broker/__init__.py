"""spotbroker broker: the domain (jobs, offers, placement, launchers, costs)."""
