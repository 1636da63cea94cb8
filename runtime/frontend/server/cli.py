"""`pagoda serve MODEL`: build the engine from vLLM-style flags, then serve it with uvicorn."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
from pathlib import Path

logger = logging.getLogger("pagoda.server")

GIB = 1 << 30
# How long in-flight responses get to deliver their engine error before the server exits.
ENGINE_DEATH_GRACE_SECONDS = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    from pagoda.runtime.engine_args import EngineArgs

    p.add_argument("model", help="a checkpoint folder (config.json, *.safetensors, tokenizer files) or a "
                   "Hugging Face model id")
    server = p.add_argument_group("server")
    server.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    server.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    key = os.environ.get("PAGODA_API_KEY")
    server.add_argument("--api-key", nargs="+", default=None if key is None else [key], metavar="KEY",
                        help="require 'Authorization: Bearer KEY' (any of these keys) on /v1 and tokenizer "
                             "routes (default: $PAGODA_API_KEY; unset means no key)")
    server.add_argument("--max-queue-len", type=int, default=None,
                        help="answer 429 when this many requests already wait (default: no limit)")
    server.add_argument("--engine-mode", default="process", choices=["process", "thread"],
                        help="run the engine's step loop in its own process, away from the HTTP server's GIL, "
                             "or in a thread of the server (starts faster; slower under load) "
                             "(default: %(default)s)")
    server.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='let tool_choice "auto" (the default with tools) read tool calls out of the text '
                             "with --tool-call-parser")
    server.add_argument("--tool-call-parser", default=None, choices=["hermes", "llama3_json", "mistral"],
                        help="the model's tool-call format: hermes (Qwen2.5, Qwen3, Hermes), llama3_json "
                             "(Llama 3.x), mistral")
    server.add_argument("--reasoning-parser", default=None, choices=["deepseek_r1", "qwen3"],
                        help="put the <think>...</think> part of answers in reasoning_content")
    server.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                        help="serve GET /tokenizer_info: the tokenizer's config, special tokens and chat template")
    server.add_argument("--trust-request-chat-template", action="store_true",
                        help="let a request bring its own chat_template (a Jinja program run on the tokenizer's "
                             "thread; refused by default, as in vLLM)")
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"],
                        help="log level for pagoda and uvicorn (default: info)")
    server.add_argument("--shutdown-timeout", type=float, default=None, metavar="SECONDS",
                        help="on SIGTERM, wait at most this long for requests in flight (default: no limit); "
                             "the operator sets it to fit the pod's termination grace period")
    from pagoda.runtime.frontend.server import limits

    limits.add_arguments(server)
    EngineArgs.add_cli_args(p.add_argument_group("engine"))


def read_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except OSError:
        pass
    return value


def has_random_weights(model: str, load_format: str = "auto") -> bool:
    """True for load_format=dummy and for tiny checkpoints whose marker says the weights are random."""
    if load_format == "dummy":
        return True
    marker = Path(model) / "tiny_model.json"
    try:
        return bool(json.loads(marker.read_text()).get("random_weights"))
    except (OSError, ValueError):
        return False


def engine_args_from(args):
    from pagoda.runtime.engine_args import EngineArgs

    return EngineArgs.from_cli_args(args)


def log_memory_plan(plan) -> None:
    if plan is None:
        return
    get = (plan.to_dict() if hasattr(plan, "to_dict") else vars(plan)).get
    per_token = get("kv_bytes_per_token", 0)
    logger.info(
        "memory: weights %.3f GiB, KV cache %d bytes/token (%.1f KiB), %s blocks x %s tokens = %s tokens "
        "fit; max_model_len %s -> %s sequences at full length",
        get("weight_bytes", 0) / GIB, per_token, per_token / 1024, get("num_kv_blocks"), get("block_size"),
        get("kv_capacity_tokens"), get("max_model_len"), get("max_concurrent_seqs"))


def build_server(args):
    """Load the engine (this takes a while: weights, memory profiling) and wrap it in the app."""
    from pagoda.runtime.frontend.server import limits
    from pagoda.runtime.frontend.server.app import build_app
    from pagoda.runtime.frontend.server.serving import ServerConfig

    engine_args = engine_args_from(args)
    engine_mode = getattr(args, "engine_mode", "process")  # callers that build args by hand (demo)
    logger.info("loading %s (engine mode: %s)", args.model, engine_mode)
    client = build_engine_client(engine_args, engine_mode, getattr(args, "log_level", "info"))
    log_memory_plan(client.memory_plan)
    random_weights = has_random_weights(args.model, args.load_format)
    if random_weights:
        logger.warning("%s has RANDOM weights: the API works, but the text it writes is meaningless",
                       args.model)
    config = ServerConfig(
        served_model_names=engine_args.served_model_name or [args.model],
        model_path=str(args.model),
        api_key=args.api_key,  # a list of keys, or None
        max_queue_len=args.max_queue_len,
        chat_template=read_chat_template(engine_args.chat_template),
        disable_log_stats=engine_args.disable_log_stats,
        random_weights=random_weights,
        enable_auto_tool_choice=getattr(args, "enable_auto_tool_choice", False),
        tool_call_parser=getattr(args, "tool_call_parser", None),
        reasoning_parser=getattr(args, "reasoning_parser", None),
        enable_tokenizer_info_endpoint=getattr(args, "enable_tokenizer_info_endpoint", False),
        trust_request_chat_template=getattr(args, "trust_request_chat_template", False),
    )
    return build_app(client, config, limits=limits.from_args(args))


def build_engine_client(engine_args, engine_mode: str, log_level: str = "info"):
    if engine_mode == "process":
        from pagoda.runtime.frontend.process_engine import ProcessEngine

        return ProcessEngine.from_engine_args(engine_args, log_level=log_level)
    from pagoda.runtime.frontend.async_engine import AsyncEngine

    return AsyncEngine.from_engine_args(engine_args)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def freeze_startup_heap() -> None:
    """Everything built before serving (the app, the tokenizer, the imported libraries, and in thread
    mode the engine) lives as long as the server. Frozen, the collector's full passes no longer walk
    it: they run on the event loop that streams every request's tokens, so each one is a pause in
    every stream and before every first token (vLLM's API server freezes its startup heap too; the
    engine process freezes its own, core/engine_proc.py)."""
    gc.collect()
    gc.freeze()


def run(args) -> int:
    import uvicorn

    from pagoda.runtime.frontend.process_engine import EngineStartError
    from pagoda.runtime.frontend.server.api_keys import APIKeyError, load_api_keys

    configure_logging(args.log_level)
    try:
        load_api_keys(args.api_key)  # before the engine loads: a bad key fails in a second, not minutes
    except APIKeyError as exc:
        logger.error("cannot serve %s: %s", args.model, exc)
        return 2
    try:
        app = build_server(args)
    except EngineStartError as exc:
        logger.error("cannot serve %s: %s", args.model, exc)
        return 1
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_keep_alive=30, timeout_graceful_shutdown=args.shutdown_timeout))
    died: list[str] = []

    def exit_on_engine_death(reason: str) -> None:
        # As vLLM does: a server without its engine can only answer 503, so it exits at once and
        # Kubernetes restarts the pod, rather than waiting for a liveness probe to notice. Requests
        # in flight have had their error already; the short grace only lets it reach them.
        died.append(reason)
        logger.error("exiting: the engine died (%s); the pod restarts", reason)
        grace = args.shutdown_timeout
        server.config.timeout_graceful_shutdown = ENGINE_DEATH_GRACE_SECONDS if grace is None \
            else min(grace, ENGINE_DEATH_GRACE_SECONDS)
        server.should_exit = True

    app.state.client.on_engine_death.append(exit_on_engine_death)
    freeze_startup_heap()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on
        pass
    if died:
        return 1
    return 0 if server.started else 3  # uvicorn's own code for a server that never started
