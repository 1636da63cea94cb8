"""The engine core: scheduler, KV cache bookkeeping and the step loop. It holds no tokenizer."""
