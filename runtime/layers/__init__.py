"""Building blocks of the Llama family, shaped for tensor parallelism (world size 1 for now)."""
