"""The parts of bench/security.py: its three nodes and the five measurements, a module each.

bench/security.py runs them in order and prints their summary; bench/ is first on sys.path,
so this package imports as `security_parts`.
"""
