"""The usage pipeline: per-tenant reports, quota recommendations and what-if replay, on Spark."""
