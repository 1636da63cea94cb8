"""`make demo`: serve the embedded demo model on 127.0.0.1, then print commands that work against it.

    python -m pagoda.runtime.tools.demo --model e2e/demo-model --port 8000

When --model holds no config.json, a tiny Llama-family checkpoint with RANDOM weights (a real
byte-level BPE tokenizer and a ChatML chat template) is generated deterministically into
.cache/demo-model-random/, and the server says so: in this output, in its log and in /v1/models.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

DEFAULT_CACHE = Path(".cache/demo-model-random")
SERVED_NAME = "pagoda-demo"


def prepare_model(model: str | Path, cache_dir: str | Path = DEFAULT_CACHE) -> tuple[Path, bool]:
    """The checkpoint to serve and whether its weights are random."""
    from pagoda.runtime.frontend.server.cli import has_random_weights

    model = Path(model)
    if (model / "config.json").is_file():
        return model, has_random_weights(str(model))
    cache_dir = Path(cache_dir)
    if not (cache_dir / "config.json").is_file():
        from pagoda.runtime.tools.tiny_models import build_tiny_model

        print(f"{model} holds no checkpoint: generating a tiny random-weight Llama into {cache_dir}",
              flush=True)
        build_tiny_model(cache_dir, "llama", seed=0)
    return cache_dir, True


def snippets(host: str, port: int, model_name: str, random_weights: bool) -> str:
    base = f"http://{host}:{port}"
    banner = ""
    if random_weights:
        banner = ("\n  NOTE: this model has RANDOM weights. Every endpoint works, but the text it writes is\n"
                  "  meaningless. Put a trained checkpoint in e2e/demo-model (or pass --model) for real text.\n")
    return f"""
Pagoda is serving {model_name} at {base}/v1
{banner}
Try it with curl:

curl -s {base}/v1/completions -H 'Content-Type: application/json' -d '{{"model": "{model_name}", "prompt": "def fibonacci(n):", "max_tokens": 48, "temperature": 0}}'

Or with the OpenAI Python client (pip install openai):

python - <<'EOF'
from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="unused")
reply = client.chat.completions.create(model="{model_name}", max_tokens=64, temperature=0,
    messages=[{{"role": "user", "content": "Return the n-th Fibonacci number."}}])
print(reply.choices[0].message.content)
EOF

Metrics: curl -s {base}/metrics | grep -E '^(vllm|pagoda):'   Stop: Ctrl-C
""".strip("\n")


async def serve(args, model_dir: Path, random_weights: bool) -> None:
    import uvicorn

    from pagoda.runtime.frontend.server.cli import build_server, configure_logging

    configure_logging(args.log_level)
    serve_args = argparse.Namespace(
        model=str(model_dir), served_model_name=[args.served_model_name], api_key=None,
        max_model_len=args.max_model_len, gpu_memory_utilization=0.9, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=None, block_size=16, num_kv_blocks=None, enable_prefix_caching=True,
        dtype="auto", device=args.device, load_format="auto", seed=0, chat_template=None, max_queue_len=None,
        enforce_eager=False, log_level=args.log_level)
    app = build_server(serve_args)
    app.state.config.random_weights = app.state.config.random_weights or random_weights
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))

    async def announce():
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.05)
        print(snippets(args.host, args.port, args.served_model_name, app.state.config.random_weights),
              flush=True)

    announcer = asyncio.ensure_future(announce())
    try:
        await server.serve()
    finally:
        announcer.cancel()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pagoda.runtime.tools.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="e2e/demo-model", help="checkpoint folder (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE),
                   help="where the random model is generated when --model is empty (default: %(default)s)")
    p.add_argument("--served-model-name", default=SERVED_NAME)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    model_dir, random_weights = prepare_model(args.model, args.cache_dir)
    try:
        asyncio.run(serve(args, model_dir, random_weights))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
