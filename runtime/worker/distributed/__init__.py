"""Tensor parallelism across processes: one process per rank, the scheduler only in rank 0.

    engine process = rank 0                         worker process = rank r (1..N-1)
    Scheduler -> executor.launch                     worker.py: loop over the step pipe
      BatchBuilder stages the step's flat arrays  ──pipe──> same arrays into its own InputBuffers
      forward (all-reduce per half-block)   <──NCCL / gloo──> forward on its weight + KV shards
      LM head: logits gathered on rank 0    <──────────────── its vocabulary slice of the logits
      sampler (rank 0 only)

launch.py starts the workers and the process group, channel.py carries each step, executor.py is
rank 0's side (an Executor, see worker/executor.py), worker.py the other ranks' loop.
"""
