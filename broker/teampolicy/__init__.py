"""A team's policy (its defaults and limits, as stored) and where its limits bite."""
