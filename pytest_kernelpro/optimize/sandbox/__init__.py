"""The sandbox: a candidate built, checked and timed in an isolated worker; the trusted judge."""
