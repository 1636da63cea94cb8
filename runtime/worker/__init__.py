"""The worker: the model runner (batch tensors, forward, CUDA graphs, sampling) and its executors."""
