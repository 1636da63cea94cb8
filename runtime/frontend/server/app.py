"""The FastAPI app: OpenAI's routes (/v1/embeddings with --runner pooling), plus /tokenize, /detokenize,
/tokenizer_info, /health, /version and /metrics.

`build_app(client, config)` wires an already-built engine client (tests hand in their own);
`pagoda serve` builds the engine from flags first (server/cli.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pagoda.runtime.frontend.engine_client import EngineClient
from pagoda.runtime.frontend.server.api_keys import load_api_keys
from pagoda.runtime.frontend.server.body import OffLoopBodyRoute
from pagoda.runtime.frontend.server.chat_template_request import chat_render
from pagoda.runtime.frontend.server.embedding_protocol import EmbeddingRequest, EmbeddingResponse
from pagoda.runtime.frontend.server.errors import APIError, bad_request, error_body, install_error_handlers
from pagoda.runtime.frontend.server.guard import GuardMiddleware
from pagoda.runtime.frontend.server.limits import RequestLimits
from pagoda.runtime.frontend.server.metrics import ServerMetrics
from pagoda.runtime.frontend.server.openapi import document_errors_as_served
from pagoda.runtime.frontend.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from pagoda.runtime.frontend.server.renderer import PromptRenderer
from pagoda.runtime.frontend.server.serving import ClientDisconnected, ServerConfig
from pagoda.runtime.frontend.server.serving_chat import ServingChat, template_message
from pagoda.runtime.frontend.server.serving_completion import ServingCompletion
from pagoda.runtime.frontend.server.serving_embedding import ServingEmbedding, check_runner
from pagoda.runtime.frontend.server.tokenizer_info import tokenizer_info

# Documented on every OpenAI route, so that the OpenAPI schema (and fuzzers reading it) know them.
ERROR_RESPONSES = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 503)}
SSE = {"text/event-stream": {"schema": {"type": "string", "description": "with stream=true: server-sent "
                                        "events of chunks, then `data: [DONE]`"}}}
# /tokenize's fields for messages; with a prompt they would change nothing, so they are refused.
CHAT_ONLY_FIELDS = ("tools", "documents", "chat_template", "chat_template_kwargs", "continue_final_message")
RANDOM_WEIGHTS_NOTE = ("This checkpoint has RANDOM weights: its output is meaningless text. It exists to "
                       "show the API working end to end.")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pagoda")
    except Exception:
        return "0.0.0"


async def log_stats(client: EngineClient, period_s: float = 10.0) -> None:
    """The engine's load and throughput every period_s while it works (off: --disable-log-stats)."""
    log = logging.getLogger("pagoda.stats")
    last = client.stats()
    while True:
        await asyncio.sleep(period_s)
        now = client.stats()
        prompt = now.get("prompt_tokens", 0) - last.get("prompt_tokens", 0)
        generated = now.get("generation_tokens", 0) - last.get("generation_tokens", 0)
        if prompt or generated or now.get("num_running") or now.get("num_waiting"):
            log.info("prompt %.1f tok/s, generation %.1f tok/s, running %d, waiting %d, KV cache %.1f%%",
                     prompt / period_s, generated / period_s, now.get("num_running", 0),
                     now.get("num_waiting", 0), 100 * now.get("kv_cache_usage", 0.0))
        last = now


def build_app(client: EngineClient, config: ServerConfig, metrics: ServerMetrics | None = None,
              limits: RequestLimits | None = None) -> FastAPI:
    limits = limits or RequestLimits(max_body_bytes=config.max_body_bytes)
    api_keys = load_api_keys(config.api_key)  # refuses an empty key before anything is served
    if metrics is None:
        metrics = ServerMetrics(config.served_model_names[0], client.stats, cache_config=client.cache_config_info)
    client.metrics = metrics
    client.max_queue_len = config.max_queue_len
    renderer = PromptRenderer(client.tokenizer, client.max_model_len, config.chat_template)
    completions = ServingCompletion(client, config, renderer)
    chat = ServingChat(client, config, renderer)
    embeddings = ServingEmbedding(client, config, renderer)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if not client.is_alive and client.dead_reason is None:
            client.start()
        logger = None if config.disable_log_stats else asyncio.ensure_future(log_stats(client))
        yield
        if logger is not None:
            logger.cancel()
        await client.shutdown()
        renderer.close()

    app = FastAPI(title="Pagoda", version=_version(), lifespan=lifespan,
                  description="OpenAI-compatible API of the Pagoda runtime.")
    app.state.client = client
    app.state.metrics = metrics
    app.state.config = config
    app.state.limits = limits
    app.state.renderer = renderer
    app.router.route_class = OffLoopBodyRoute
    install_error_handlers(app)
    document_errors_as_served(app)
    app.add_middleware(GuardMiddleware, api_keys=api_keys, max_body_bytes=limits.max_body_bytes)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected):
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.get("/health")
    async def health():
        if not client.is_alive:
            return JSONResponse(error_body(503, f"engine is down: {client.dead_reason}",
                                           code="engine_unavailable"), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version():
        return {"version": _version()}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card(name: str) -> ModelCard:
        note = RANDOM_WEIGHTS_NOTE if config.random_weights else None
        return ModelCard(id=name, created=started, root=config.model_path, max_model_len=client.max_model_len,
                         random_weights=config.random_weights, description=note,
                         owned_by="pagoda (random weights)" if config.random_weights else "pagoda")

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def models():
        return ModelList(data=[model_card(name) for name in config.served_model_names])

    @app.get("/v1/models/{model:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def retrieve_model(model: str):
        if model not in config.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
        return model_card(model)

    if config.enable_tokenizer_info_endpoint:
        @app.get("/tokenizer_info", responses=ERROR_RESPONSES)
        async def get_tokenizer_info():
            return JSONResponse(tokenizer_info(client.tokenizer, config.chat_template))

    @app.post("/v1/completions", responses={200: {"model": CompletionResponse, "content": SSE}, **ERROR_RESPONSES})
    async def create_completion(req: CompletionRequest, raw: Request):
        check_runner(client, "Completions", pooling=False)
        limits.check(req)
        return await completions.create(req, raw)

    @app.post("/v1/chat/completions",
              responses={200: {"model": ChatCompletionResponse, "content": SSE}, **ERROR_RESPONSES})
    async def create_chat_completion(req: ChatCompletionRequest, raw: Request):
        check_runner(client, "Chat Completions", pooling=False)
        limits.check(req)
        return await chat.create(req, raw)

    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERROR_RESPONSES)
    async def create_embedding(req: EmbeddingRequest, raw: Request):
        return await embeddings.create(req, raw, limits.max_prompts)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES)
    async def tokenize(req: TokenizeRequest):
        chat.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages", param="prompt")
        if req.messages is not None:
            if not req.messages:
                raise bad_request("messages must not be empty", param="messages")
            tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
            render = chat_render(req, tools=tools, trust_request_template=config.trust_request_chat_template,
                                 add_special_tokens=bool(req.add_special_tokens))
            _, ids = await renderer.encode_chat([template_message(m) for m in req.messages], render)
        else:
            for name in CHAT_ONLY_FIELDS:
                if getattr(req, name):
                    raise bad_request(f"{name} applies to messages, not to a prompt", param=name)
            ids = await renderer.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False)
        strs = client.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return TokenizeResponse(tokens=list(ids), count=len(ids), max_model_len=client.max_model_len, token_strs=strs)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES)
    async def detokenize(req: DetokenizeRequest):
        chat.check_model(req.model)
        chat.check_token_ids(req.tokens, param="tokens")
        return DetokenizeResponse(prompt=await renderer.decode(req.tokens))

    return app
