"""Helpers for bench/stomp_vs_activemq.py: brokers to start, a STOMP sink, client processes."""
