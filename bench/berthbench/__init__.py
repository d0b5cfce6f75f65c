"""bench/run-compare's parts: berth and its peers measured in one run (see bench/README.md)."""
