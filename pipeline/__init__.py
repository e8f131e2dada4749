"""The PySpark ``journal`` data source and the pipeline jobs."""
