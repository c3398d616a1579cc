"""The metadata-service simulator's former name, kept so that the documented
`python -m spotbroker.agent.simulator` still runs it: the simulator itself is
`spotbroker.agent.metadata_sim` (told apart by name from the broker's spot
trace simulator, `spotbroker.broker.sim`)."""
