"""The frontend: tokenizer, detokenization, output processing, engine clients, `LLM` and the server."""
