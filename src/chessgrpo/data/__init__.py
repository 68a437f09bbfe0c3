"""Datasets: labelled-position Parquet shards (schema in `schema.py`), generation and import."""
