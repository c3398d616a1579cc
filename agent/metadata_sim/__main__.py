import sys

from spotbroker.agent.metadata_sim.cli import main

if __name__ == "__main__":  # not when a tool imports every module of the package
    main(sys.argv[1:])
