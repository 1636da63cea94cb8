"""Triton compiles after start-up, made visible.

A Triton kernel is built once per specialization: its constexprs, and for each integer argument
whether it is 1 or a multiple of 16 (pointers: whether they are 16-byte aligned). A request with a
shape that start-up never met builds one there and then, on the step thread, stalling every
request in the batch for up to a second: the TTFT tail of issue 17. The engine's warm-up
(pagoda.runtime.core.warmup) meets the shapes a server sees; this watch says, once per kernel and
specialization, when one was missed.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class CompileWatch:
    def __init__(self) -> None:
        self.started = False
        # Engines loading and warming up in this process now: their compiles are expected ones. A
        # process may start several (a test, the GPU correctness run), each after others have served.
        self.starting = 0
        self.compiles_after_startup = 0
        self._previous = None
        self._installed = False

    def install(self) -> None:
        """Chain onto Triton's post-compile hook (a no-op where this Triton has none)."""
        try:
            from triton import knobs
        except ImportError:
            return
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook") or self._installed:
            return
        self._previous = runtime.jit_post_compile_hook
        runtime.jit_post_compile_hook = self.on_compile
        self._installed = True

    def mark_starting(self) -> None:
        self.starting += 1

    def mark_started(self) -> None:
        """An engine is up (or failed to start): pair of mark_starting."""
        self.starting = max(0, self.starting - 1)
        self.started = True

    def on_compile(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):
        if self._previous is not None:
            self._previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                           already_compiled=already_compiled)
        if self.started and not self.starting and not is_manual_warmup:
            self.compiles_after_startup += 1
            logger.warning("Triton built %s.%s after start-up, stalling this step (the warm-up never met "
                           "this specialization): %s", fn.module, fn.name, describe(repr, compile))
        return None


def describe(repr: str, compile: dict) -> str:
    """The launch options, argument types, 16-divisibility and constexprs that make this
    specialization. Triton's own repr pairs the parameters with a key whose layout changed (3.6
    names only the first argument), so this spells out what the compile was given. Constants and
    attributes are keyed by argument position (a path tuple)."""
    signature = compile.get("signature")
    if not isinstance(signature, dict):
        return repr
    names = list(signature)

    def by_name(table) -> dict:
        return {names[path[0]]: value for path, value in (table or {}).items()
                if isinstance(path, tuple) and len(path) == 1 and 0 <= path[0] < len(names)}

    constants = by_name(compile.get("constants"))
    configs = compile.get("configs") or [{}]
    divisible = {name for name, attr in by_name(configs[0]).items() if "tt.divisibility" in str(attr)}
    args = ", ".join(f"{name}={constants[name]}" if name in constants
                     else f"{name}: {ty}{' (16-divisible)' if name in divisible else ''}"
                     for name, ty in signature.items())
    return f"{repr.split('(', 1)[0]}({args})"


WATCH = CompileWatch()
