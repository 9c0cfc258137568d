"""The data pipeline on Spark: `pinmq check` reads the audit logs of a cluster and its clients
(broker/audit.py) and proves, or disproves, ordering, exclusivity and no loss.

history.py reads the segments, checks.py holds the checks (DataFrame -> violations), stats.py
the statistics, job.py runs them, report.py writes the HTML report, cli.py is the verb,
synth.py generates synthetic histories, pure.py is the single-process Python reference.
"""
