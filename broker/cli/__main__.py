from spotbroker.broker.cli import main

main()
