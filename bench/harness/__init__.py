"""What the benchmark scripts share: node processes, client load, CPU readings, percentiles.

The scripts run as `python bench/<script>.py`, so `bench/` is first on sys.path and this
package imports as `harness`.
"""
