"""What the tests share: helpers, fixtures that start local fakes (moto,
Azurite, Google's endpoints, SkyPilot's), and the fakes themselves.
Imported as `support.<module>` (pyproject puts tests/ on the path)."""
