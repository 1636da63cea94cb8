"""`pagoda serve MODEL`: build the engine from vLLM-style flags, then serve it with uvicorn."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

logger = logging.getLogger("pagoda.server")

GIB = 1 << 30
# How long in-flight responses get to deliver their engine error before the server exits.
ENGINE_DEATH_GRACE_SECONDS = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="local checkpoint folder (config.json, *.safetensors, tokenizer files)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) the API accepts and reports (default: the MODEL argument)")
    p.add_argument("--api-key", default=os.environ.get("PAGODA_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 and tokenizer routes "
                        "(default: $PAGODA_API_KEY; unset means no key)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest sequence, prompt plus output, in tokens (default: from config.json)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory for weights, activations and the KV cache (default: 0.9)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="most sequences in one batch (default: 1024 on a GPU of 70 GiB or more, else 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="most tokens in one step, prefill and decode together (default: engine's choice)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block (default: 16)")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV-cache blocks to allocate, overriding the memory arithmetic")
    p.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="switch off reuse of cached KV blocks for shared prompt prefixes")
    p.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"],
                   help="weight and activation dtype (default: auto, from config.json)")
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when available), cuda, cuda:N or cpu (default: auto)")
    p.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "dummy"],
                   help="weights from safetensors files, or 'dummy' random weights (default: auto)")
    p.add_argument("--seed", type=int, default=0, help="engine random seed (default: 0)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one (default: the tokenizer's own)")
    p.add_argument("--max-queue-len", type=int, default=None,
                   help="answer 429 when this many requests already wait (default: no limit)")
    p.add_argument("--enforce-eager", action="store_true", help="do not capture CUDA graphs")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="launch the next decode step before reading this one's tokens (default: on)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
                   help="split the model over N GPUs of this host, one process per GPU (N must divide the "
                        "attention heads; on --device cpu, N gloo ranks) (default: %(default)s)")
    p.add_argument("--engine-mode", default="process", choices=["process", "thread"],
                   help="run the engine's step loop in its own process, away from the HTTP server's GIL, or "
                        "in a thread of the server (starts faster; slower under load) (default: %(default)s)")
    p.add_argument("--structured-outputs-config.disable_any_whitespace", "--structured-outputs-disable-any-whitespace",
                   dest="structured_outputs_disable_any_whitespace", action="store_true",
                   help="JSON structured outputs (response_format, structured_outputs.json) allow no free "
                        "whitespace between tokens, unless a request asks for it (default: free whitespace)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let tool_choice "auto" (the default with tools) read tool calls out of the text with '
                        "--tool-call-parser")
    p.add_argument("--tool-call-parser", default=None, choices=["hermes", "llama3_json", "mistral"],
                   help="the model's tool-call format: hermes (Qwen2.5, Qwen3, Hermes), llama3_json (Llama 3.x), "
                        "mistral")
    p.add_argument("--reasoning-parser", default=None, choices=["deepseek_r1", "qwen3"],
                   help="put the <think>...</think> part of answers in reasoning_content")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"],
                   help="log level for pagoda and uvicorn (default: info)")
    p.add_argument("--shutdown-timeout", type=float, default=None, metavar="SECONDS",
                   help="on SIGTERM, wait at most this long for requests in flight (default: no limit); "
                        "the operator sets it to fit the pod's termination grace period")
    from pagoda.runtime.frontend.server import limits

    limits.add_arguments(p)


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

    return EngineArgs(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed,
        load_format=args.load_format,
        enforce_eager=args.enforce_eager,
        async_scheduling=getattr(args, "async_scheduling", True),
        tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),  # namespaces built by hand (demo)
        served_model_name=(args.served_model_name or [None])[0],
        chat_template=read_chat_template(args.chat_template),
        structured_outputs_disable_any_whitespace=getattr(args, "structured_outputs_disable_any_whitespace", False),
    )


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
        served_model_names=args.served_model_name or [args.model],
        model_path=str(args.model),
        api_key=args.api_key,
        max_queue_len=args.max_queue_len,
        chat_template=engine_args.chat_template,
        random_weights=random_weights,
        enable_auto_tool_choice=getattr(args, "enable_auto_tool_choice", False),
        tool_call_parser=getattr(args, "tool_call_parser", None),
        reasoning_parser=getattr(args, "reasoning_parser", None),
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
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on
        pass
    if died:
        return 1
    return 0 if server.started else 3  # uvicorn's own code for a server that never started
