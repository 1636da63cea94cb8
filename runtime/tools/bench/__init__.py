"""Benchmarks from BENCHMARKS.md: offline throughput (W1, W4), single-stream latency (W2) and the
online-serving load generator (W3). `pagoda bench --help` lists them; results go to e2e/results/.

Nothing here imports torch at module import time: `pagoda bench serve` drives a remote server and
runs where torch is not installed.
"""
