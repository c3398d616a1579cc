"""Local fakes of the clouds' price APIs, for the tests and bench/prices.py:
`clouds` (one HTTP server answering each price API with its real shapes and
paging), `data` (what it answers, from the bundled snapshot's rows) and
`price_list` (AWS's Price List Bulk API files). The broker itself never
imports them: a price source reads them only when a test or a benchmark
points it at a fake's URL."""
