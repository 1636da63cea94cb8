"""Tools around the runtime: benchmarks, tiny random-weight checkpoints and the demo."""
