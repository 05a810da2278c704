"""Batch prediction: capsnet-predict writes poses, classes and "not a digit" scores of a dataset to Parquet."""
