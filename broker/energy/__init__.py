"""What a run burns: energy (kWh) and emissions (kg CO2e) per place.

* `grid`: the grid carbon intensity of each cloud region, from a bundled
  snapshot whose every row names its source (data/README.md), and the live
  figure when an operator gives an Electricity Maps key (`electricitymaps`).
* `power`: the power a node draws at the wall, estimated from its GPUs'
  board power, its vCPUs and memory, and the provider's PUE; the agent's
  NVML reading (agent/energy.py) replaces the estimate where it has one.
"""
