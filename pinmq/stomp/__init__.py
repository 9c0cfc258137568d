"""STOMP 1.0/1.1/1.2 for pinmq: a sans-IO frame codec, a per-connection session, a server."""
