"""pinmq: the node process, its protocol shells and the command line (the top layers)."""
