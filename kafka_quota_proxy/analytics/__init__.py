"""The usage pipeline: per-tenant reports, quota recommendations and what-if replay, on Spark.

generate.py (synthetic logs in the proxy's format), reading.py (the log into Spark, bad lines
counted), stats.py (per-tenant statistics), recommend.py (defaults and overrides, as YAML and
kafka-configs commands), replay.py (a unit's usage through quota/'s engine) and whatif.py (all
units on Spark), report_html.py and plots.py (the report), pipeline.py (the stages in order),
cli.py (`analyze`, `generate-usage`). Importing the package costs nothing: cli.py imports Spark,
pandas and matplotlib only when a command runs.
"""
