"""Cluster connections: topology, clustered routing and store-and-forward between nodes."""
