"""spotbroker node agent: notice watchers, supervisor, checkpoint library."""
