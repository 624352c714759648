"""One module per command; cli.py registers them. Each command gathers plain data, hands it
to one output layer, and raises its errors: cli.py turns them into exit codes."""
