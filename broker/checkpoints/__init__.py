"""What the broker knows of checkpoints: where they live and which URIs it
accepts, the rows (the newest, `keep`), the cold tier and what storing them costs.
Writing and reading one is the checkpoint library's (agent/checkpoint/)."""
