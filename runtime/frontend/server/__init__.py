"""The OpenAI-compatible HTTP server: FastAPI app, protocol models, engine client and metrics.

Nothing is imported here, so that `pagoda serve --help` stays fast and torch-free.
"""
