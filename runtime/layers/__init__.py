"""Building blocks of the Llama family, sharded for tensor parallelism (see parallel_state.py)."""
