"""SGLang plugin that routes SGLang 0.5.23's sm_120 indexer and sparse-MLA decode to dsv4kit kernels.

How it gets in
--------------
The dsv4kit wheel registers ``register`` under SGLang's ``sglang.srt.plugins`` entry-point group.
SGLang calls every such entry in each scheduler / worker process (``load_plugins()``, called at
the top of ``run_scheduler_process``), then ``HookRegistry.apply_hooks()`` rebinds each
registered target with ``setattr`` on its module (plus stale ``from X import Y`` copies). Both
targets are looked up at call time by SGLang (docs/sglang-contract.md §3.1 and §4.7), so a rebinding is enough.

What it does
------------
For each target of :data:`dsv4kit.rollout.targets.TARGETS` whose flag is on, it checks

1. the SGLang version is in ``SUPPORTED_SGLANG_VERSIONS``;
2. the target module imports (for the TileLang target: ``tilelang`` imports), the function
   exists with exactly the expected parameter names, the kept constant exists, and the dsv4kit
   kernel module is installed;

and only then registers a ``HookType.REPLACE`` hook: a guard object holding the original
function. On the first call that would go to the kernel, the guard checks the shapes and dtypes
against the contract (docs/sglang-contract.md §2.2 / §4.2), imports the kernel and runs it; any mismatch or error
there switches that target back to the original for the rest of the process. Every failed check
leaves SGLang's function in place and logs one WARNING line naming the target and the reason;
nothing here raises into SGLang.

This module imports only the standard library; torch and the kernels are imported on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import math
import threading
from typing import Any, Callable, Optional

from dsv4kit.rollout.targets import (
    ATTENTION_KWARGS,
    SUPPORTED_SGLANG_VERSIONS,
    TARGETS,
    Target,
    canonical_parameters,
    docstring_parameters,
    format_parameters,
    read_flag,
    sglang_version,
    version_supported,
)

logger = logging.getLogger(__name__)
_PREFIX = "dsv4kit rollout:"

# Per target key: {"status": ..., "reason": ..., "kernel_calls": n, "original_calls": n}, and
# "refused_calls" / "last_refusal" / "refusals_logged" once the kernel has refused later calls.
# status: "stock" (not hooked), "hooked" (hook registered, no call yet), "kernel" (first call
# passed, served by dsv4kit), "fallback" (first call failed its guard: the original serves).
_STATE: dict = {}
_registered = False
_lock = threading.Lock()


def rollout_state() -> dict:
    """A copy of what the plugin did in this process, per target key (for logs and tests)."""
    return {key: dict(value) for key, value in _STATE.items()}


def _mark_stock(target: Target, reason: str) -> None:
    _STATE[target.key] = {"status": "stock", "reason": reason, "kernel_calls": 0,
                          "original_calls": 0}


def _stock(target: Target, reason: str) -> None:
    _mark_stock(target, reason)
    logger.warning("%s %s stays stock: %s", _PREFIX, target.dotted, reason)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point. Idempotent; never raises."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    try:  # the serving units ask for it (service.env); independent of the kernel flags
        from dsv4kit.rollout import loopback_store

        loopback_store.install()
    except Exception as exc:
        logger.warning("%s the loopback store could not be installed, torch's store listens on every address: "
                       "%s: %s", _PREFIX, type(exc).__name__, _first_line(exc))
    try:  # the servers' API keys out of launch_command and the server_args= log line
        from dsv4kit.rollout import key_redaction

        key_redaction.install()
    except ImportError:
        pass  # no SGLang here: nothing logs its arguments
    except Exception as exc:
        logger.warning("%s the API keys could not be added to SGLang's redaction (they may show in its "
                       "server_args= log line and launch_command): %s: %s", _PREFIX, type(exc).__name__,
                       _first_line(exc))
    try:
        _register()
    except Exception as exc:  # a plugin bug must not take the server down
        logger.warning("%s internal error, SGLang stays stock for the remaining targets: %s: %s",
                       _PREFIX, type(exc).__name__, _first_line(exc))


def _register() -> None:
    wanted = []
    invalid: dict = {}
    for target in TARGETS:
        flag = read_flag(target.flag)
        if flag.error:
            invalid.setdefault(flag.error, []).append(target)
        elif flag.enabled:
            wanted.append(target)
    for error, targets in invalid.items():
        for target in targets:
            _mark_stock(target, error)
        logger.warning("%s %s; %s stay stock", _PREFIX, error, ", ".join(t.dotted for t in targets))
    if not wanted:
        return

    version = sglang_version()
    if not version_supported(version):
        shown = version or "unknown (no sglang distribution metadata)"
        for target in wanted:
            _mark_stock(target, f"SGLang {shown} is not supported")
        logger.warning("%s SGLang %s is not a supported version (supported: %s); %s stay stock",
                       _PREFIX, shown, ", ".join(SUPPORTED_SGLANG_VERSIONS),
                       ", ".join(t.dotted for t in wanted))
        return

    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception as exc:
        for target in wanted:
            _mark_stock(target, "no SGLang hook registry")
        logger.warning("%s cannot import SGLang's hook registry (%s: %s); everything stays stock",
                       _PREFIX, type(exc).__name__, _first_line(exc))
        return

    for target in wanted:
        register_target(target, HookRegistry, HookType)


def register_target(target: Target, registry, hook_type) -> bool:
    """Check one target and register its guard as a REPLACE hook; False (stock, logged) if not."""
    try:
        original, module, reason = _resolve(target)
    except Exception as exc:
        original, module, reason = None, None, f"check failed: {type(exc).__name__}: {_first_line(exc)}"
    if reason:
        _stock(target, reason)
        return False
    _STATE[target.key] = {"status": "hooked", "reason": None, "kernel_calls": 0,
                          "original_calls": 0}
    guard_class = (_AttentionGuard if target.keep_attribute
                   else _Fp4IndexerGuard if target.key == "indexer_fp4" else _IndexerGuard)
    try:
        registry.register(target.dotted, guard_class(target, original, module), hook_type.REPLACE)
    except Exception as exc:
        _stock(target, f"SGLang's HookRegistry.register failed: {type(exc).__name__}: "
                       f"{_first_line(exc)}")
        return False
    logger.info("%s %s -> %s (guarded; checked again on the first call)", _PREFIX,
                target.dotted, target.kernel)
    return True


def _resolve(target: Target):
    """``(original, module, None)`` when the target may be replaced, else ``(None, None, reason)``."""
    if target.requires:
        try:
            importlib.import_module(target.requires)
        except Exception as exc:
            return None, None, (f"{target.requires} is not importable ({type(exc).__name__}: "
                                f"{_first_line(exc)}); this target is not used without it")
    if importlib.util.find_spec(target.kernel_module) is None:
        return None, None, f"the dsv4kit kernel module {target.kernel_module} is not installed"
    try:
        module = importlib.import_module(target.module)
    except Exception as exc:
        return None, None, f"cannot import {target.module} ({type(exc).__name__}: {_first_line(exc)})"
    original = getattr(module, target.function, None)
    if original is None:
        return None, None, (f"{target.module} has no {target.function} (moved or renamed in this "
                            "SGLang?)")
    if not callable(original):
        return None, None, f"{target.dotted} is not callable ({type(original).__name__})"
    problem = _signature_problem(target, original)
    if problem:
        return None, None, problem
    if target.keep_attribute:
        value = getattr(module, target.keep_attribute, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return None, None, (f"{target.module}.{target.keep_attribute} is missing or not a "
                                f"positive int (found {value!r})")
    return original, module, None


def _signature_problem(target: Target, original) -> Optional[str]:
    """None when ``original`` takes the target's parameters (see ``Target.leading_parameters``)."""
    expected = tuple(target.parameters)
    try:
        signature = inspect.signature(original)
        found = canonical_parameters(signature)
        defaulted = tuple(p.default is not inspect.Parameter.empty
                          for p in signature.parameters.values())
    except (TypeError, ValueError) as exc:
        parsed = docstring_parameters(getattr(original, "__doc__", None), target.function) \
            if target.leading_parameters else None
        if parsed is None:
            return f"cannot read the signature of {target.dotted}: {exc}"
        found, defaulted = parsed
    if not target.leading_parameters:
        if found != expected:
            return (f"signature is {format_parameters(found)}, dsv4kit expects "
                    f"{format_parameters(expected)}")
        return None
    if found[:len(expected)] != expected or not all(defaulted[len(expected):]):
        return (f"signature is {format_parameters(found)}, dsv4kit expects "
                f"{format_parameters(expected)} first and defaults on the rest")
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class _Guard:
    """The REPLACE hook: the original until the first call passes, then the kernel."""

    def __init__(self, target: Target, original: Callable, module: Any):
        self.target = target
        self.original = original
        self.module = module
        self.kernel: Optional[Callable] = None
        self.kernel_module: Any = None
        self.state = _STATE[target.key]

    # The guard's first-call path. Subclasses supply contract() and describe().
    def _first_call(self, args: tuple, kwargs: dict):
        problem = None
        try:
            problem = self.contract(args, kwargs)
        except Exception as exc:
            problem = f"contract check raised {type(exc).__name__}: {_first_line(exc)}"
        if problem is None:
            try:
                self.kernel_module = importlib.import_module(self.target.kernel_module)
                self.kernel = getattr(self.kernel_module, self.target.kernel_attribute)
            except Exception as exc:
                problem = (f"cannot load {self.target.kernel} ({type(exc).__name__}: "
                           f"{_first_line(exc)})")
        if problem is not None:
            return self._fall_back(f"first call: {problem}", args, kwargs)
        try:
            result = self.call_kernel(args, kwargs)
        except Exception as exc:
            return self._fall_back(f"first call: {self.target.kernel} raised "
                                   f"{type(exc).__name__}: {_first_line(exc)}", args, kwargs)
        self.state["status"] = "kernel"
        self.state["kernel_calls"] = self.state.get("kernel_calls", 0) + 1
        logger.info("%s %s now served by %s (first call: %s)", _PREFIX, self.target.dotted,
                    self.target.kernel, self.describe(args, kwargs))
        return result

    def _fall_back(self, reason: str, args: tuple, kwargs: dict):
        self.state["status"] = "fallback"
        self.state["reason"] = reason
        logger.warning("%s %s falls back to SGLang's original for this process: %s", _PREFIX,
                       self.target.dotted, reason)
        return self._original(args, kwargs)

    def _original(self, args: tuple, kwargs: dict):
        self.state["original_calls"] = self.state.get("original_calls", 0) + 1
        return self.original(*args, **kwargs)

    def call_kernel(self, args: tuple, kwargs: dict):
        return self.kernel(*args, **kwargs)

    def _later_call(self, args: tuple, kwargs: dict):
        """A call after the first one passed. The first call checks one shape; a later one may
        bring arguments the kernel refuses: its host checks raise KernelArgumentError before any
        launch, and SGLang's original serves that call (also inside a CUDA-graph capture: nothing
        of ours was recorded). Any other exception outside a capture (e.g. a compile variant first
        met by a later shape) hands the target to the original for the calls still to come (graphs
        captured earlier keep the kernel). Inside a capture, and for out-of-memory, the exception
        is SGLang's to see: hiding it would hand SGLang a broken capture or a false diagnosis."""
        from dsv4kit.kernels.errors import KernelArgumentError

        try:
            result = self.kernel(*args, **kwargs)
        except KernelArgumentError as exc:
            self._refused(exc)
            return self._original(args, kwargs)
        except Exception as exc:
            if _capturing() or type(exc).__name__ == "OutOfMemoryError":
                raise
            return self._fall_back(f"a later call: {self.target.kernel} raised {type(exc).__name__}: "
                                   f"{_first_line(exc)}", args, kwargs)
        self.state["kernel_calls"] += 1
        return result

    def _refused(self, exc: Exception) -> None:
        self.state["refused_calls"] = self.state.get("refused_calls", 0) + 1
        message = _first_line(exc)
        self.state["last_refusal"] = message
        # Logged once per argument the kernel names (the text before the first comma / "got"),
        # so a refusal that recurs at every batch size does not flood the log.
        seen = self.state.setdefault("refusals_logged", [])
        key = message.split(",")[0].split(" got ")[0][:120]
        if key not in seen and len(seen) < _MAX_REFUSALS_LOGGED:
            seen.append(key)
            logger.warning("%s %s: %s refused a call, SGLang's original serves it (logged once per "
                           "kind; 'refused_calls' counts them): %s", _PREFIX, self.target.dotted,
                           self.target.kernel, message)


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without torch.cuda)."""
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


_MAX_REFUSALS_LOGGED = 8


class _IndexerGuard(_Guard):
    """fp8 paged MQA logits: the eight positional arguments of docs/sglang-contract.md §2.2."""

    def __call__(self, *args, **kwargs):
        status = self.state.get("status")
        if status == "kernel":
            return self._later_call(args, kwargs)
        if status == "fallback":
            return self._original(args, kwargs)
        return self._first_call(args, kwargs)

    def _bound(self, args, kwargs) -> dict:
        bound = inspect.signature(self.original).bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def contract(self, args, kwargs) -> Optional[str]:
        import torch

        try:
            a = self._bound(args, kwargs)
        except TypeError as exc:
            return f"arguments do not bind to {self.target.function}: {exc}"
        q, kv, weight = a["q_fp8"], a["kvcache_fp8"], a["weight"]
        seq_lens, page_table, max_seq_len = a["seq_lens"], a["page_table"], a["max_seq_len"]
        for name in ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table"):
            if not isinstance(a[name], torch.Tensor):
                return f"{name} is a {type(a[name]).__name__}, not a tensor"
        if q.dtype != torch.float8_e4m3fn or q.dim() != 4 or tuple(q.shape[1:]) != (1, 64, 128):
            return f"q_fp8 is {_desc(q)}, expected float8_e4m3fn [B, 1, 64, 128]"
        batch = q.shape[0]
        if kv.dtype != torch.uint8 or kv.dim() != 4 or tuple(kv.shape[1:]) != (64, 1, 132):
            return f"kvcache_fp8 is {_desc(kv)}, expected uint8 [pages, 64, 1, 132]"
        if weight.dtype != torch.float32 or tuple(weight.shape) != (batch, 64):
            return f"weight is {_desc(weight)}, expected float32 [{batch}, 64]"
        if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) not in ((batch,), (batch, 1)):
            return f"seq_lens is {_desc(seq_lens)}, expected int32 [{batch}] or [{batch}, 1]"
        if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != batch:
            return f"page_table is {_desc(page_table)}, expected int32 [{batch}, P]"
        if (isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int)
                or not 1 <= max_seq_len <= page_table.shape[1] * 64):
            return (f"max_seq_len is {max_seq_len!r}, expected an int in "
                    f"[1, P*64 = {page_table.shape[1] * 64}]")
        if a["clean_logits"] is not False:
            return f"clean_logits is {a['clean_logits']!r}, expected False"
        for name in ("kvcache_fp8", "weight", "seq_lens", "page_table"):
            if a[name].device != q.device:
                return f"{name} is on {a[name].device}, q_fp8 on {q.device}"
        return None

    def describe(self, args, kwargs) -> str:
        a = self._bound(args, kwargs)
        return f"B={a['q_fp8'].shape[0]}, P={a['page_table'].shape[1]}, max_seq_len={a['max_seq_len']}"


class _Fp4IndexerGuard(_IndexerGuard):
    """DeepGEMM's ``fp8_fp4_paged_mqa_logits`` as SGLang calls it with the FP4 index-K cache:
    eight positional arguments (docs/sglang-contract.md §2.10); DeepGEMM's two keyword extras
    (``logits_dtype``, ``indices``) are passed through to the kernel, which refuses others."""

    EXTRAS = ("logits_dtype", "indices")

    def _bound(self, args, kwargs) -> dict:
        names = tuple(self.target.parameters) + self.EXTRAS
        if len(args) > len(names):
            raise TypeError(f"{len(args)} positional arguments, at most {len(names)}")
        bound = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in bound:
                raise TypeError(f"unexpected or repeated argument {key!r}")
            bound[key] = value
        missing = [n for n in self.target.parameters[:7] if n not in bound]
        if missing:
            raise TypeError(f"missing arguments {missing}")
        bound.setdefault("clean_logits", False)
        return bound

    def contract(self, args, kwargs) -> Optional[str]:
        import torch

        try:
            a = self._bound(args, kwargs)
        except TypeError as exc:
            return f"arguments do not bind to {self.target.function}: {exc}"
        q = a["q"]
        if not isinstance(q, (tuple, list)) or len(q) != 2 \
                or not all(isinstance(x, torch.Tensor) for x in q):
            return f"q is {type(q).__name__}, expected the pair (q_fp4, q_sf)"
        q_fp4, q_sf = q
        if q_fp4.element_size() != 1 or q_fp4.dim() != 4 or tuple(q_fp4.shape[1:]) != (1, 64, 64):
            return f"q_fp4 is {_desc(q_fp4)}, expected packed e2m1 bytes [B, 1, 64, 64]"
        batch = q_fp4.shape[0]
        if q_sf.dtype != torch.int32 or tuple(q_sf.shape) != (batch, 1, 64):
            return f"q_sf is {_desc(q_sf)}, expected int32 [{batch}, 1, 64]"
        kv, weights = a["kv_cache"], a["weights"]
        lens, table, max_len = a["context_lens"], a["block_table"], a["max_context_len"]
        for name in ("kv_cache", "weights", "context_lens", "block_table"):
            if not isinstance(a[name], torch.Tensor):
                return f"{name} is a {type(a[name]).__name__}, not a tensor"
        if kv.dtype != torch.uint8 or kv.dim() != 4 or tuple(kv.shape[1:]) != (64, 1, 68):
            return f"kv_cache is {_desc(kv)}, expected uint8 [pages, 64, 1, 68]"
        if weights.dtype != torch.float32 or tuple(weights.shape) != (batch, 64):
            return f"weights is {_desc(weights)}, expected float32 [{batch}, 64]"
        if lens.dtype != torch.int32 or tuple(lens.shape) not in ((batch,), (batch, 1)):
            return f"context_lens is {_desc(lens)}, expected int32 [{batch}, 1] or [{batch}]"
        if table.dtype != torch.int32 or table.dim() != 2 or table.shape[0] != batch:
            return f"block_table is {_desc(table)}, expected int32 [{batch}, P]"
        if isinstance(max_len, bool) or not isinstance(max_len, int) \
                or not 1 <= max_len <= table.shape[1] * 64:
            return (f"max_context_len is {max_len!r}, expected an int in "
                    f"[1, P*64 = {table.shape[1] * 64}]")
        if a["clean_logits"] is not False:
            return f"clean_logits is {a['clean_logits']!r}, expected False"
        if a.get("logits_dtype", torch.float32) != torch.float32 or a.get("indices") is not None:
            return "logits_dtype other than float32 or indices given (DeepGEMM-only options)"
        for name in ("kv_cache", "weights", "context_lens", "block_table"):
            if a[name].device != q_fp4.device or q_sf.device != q_fp4.device:
                return f"{name} is on {a[name].device}, q_fp4 on {q_fp4.device}"
        return None

    def describe(self, args, kwargs) -> str:
        a = self._bound(args, kwargs)
        return (f"B={a['q'][0].shape[0]}, P={a['block_table'].shape[1]}, "
                f"max_context_len={a['max_context_len']}")


def _v4_page_bytes(page_size: int) -> int:
    # KVLayout.V4 (docs/sglang-contract.md §4.3): 584 bytes a token, pages padded to a multiple of 576 bytes.
    return math.ceil(page_size * 584 / 576) * 576


class _AttentionGuard(_Guard):
    """Sparse-MLA decode, keyword arguments only (docs/sglang-contract.md §4.2). ``T`` above the kernel's limit (and
    above SGLang's ``SM120_DECODE_MAX_TOKENS``) goes to the original on every call."""

    def __init__(self, target: Target, original: Callable, module: Any):
        super().__init__(target, original, module)
        self.max_tokens = int(getattr(module, target.keep_attribute))

    def __call__(self, *args, **kwargs):
        status = self.state.get("status")
        if args or status == "fallback":
            return self._original(args, kwargs)
        q = kwargs.get("q")
        shape = getattr(q, "shape", None)
        if not shape or shape[0] > self.max_tokens:
            return self._original(args, kwargs)
        if status == "kernel":
            return self._later_call(args, kwargs)
        return self._first_call(args, kwargs)

    def call_kernel(self, args, kwargs):
        limit = getattr(self.kernel_module, "SM120_DECODE_MAX_TOKENS", self.max_tokens)
        self.max_tokens = min(self.max_tokens, int(limit))
        if kwargs["q"].shape[0] > self.max_tokens:
            # Checked and loaded, but this call is beyond the kernel: the original serves it.
            self.state["original_calls"] = self.state.get("original_calls", 0) + 1
            return self.original(**kwargs)
        return self.kernel(**kwargs)

    def contract(self, args, kwargs) -> Optional[str]:
        import torch

        unknown = sorted(set(kwargs) - set(ATTENTION_KWARGS))
        if unknown:
            return f"unexpected keyword arguments {unknown}"
        missing = [k for k in ("q", "k_cache", "head_dim_v", "softmax_scale", "indices",
                               "topk_length", "attn_sink") if kwargs.get(k) is None]
        if missing:
            return f"missing keyword arguments {missing}"
        q = kwargs["q"]
        if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16 or q.dim() != 4 \
                or q.shape[1] != 1 or q.shape[3] != 512 or not 1 <= q.shape[2] <= 64:
            return f"q is {_desc(q)}, expected bfloat16 [T, 1, H<=64, 512]"
        T, heads = q.shape[0], q.shape[2]
        if kwargs["head_dim_v"] != 512:
            return f"head_dim_v is {kwargs['head_dim_v']!r}, expected 512"
        scale = kwargs["softmax_scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            return f"softmax_scale is {scale!r}, expected a positive float"
        problem = _v4_cache_problem("k_cache", kwargs["k_cache"]) \
            or _index_problem("indices", kwargs["indices"], T) \
            or _length_problem("topk_length", kwargs["topk_length"], T)
        if problem:
            return problem
        sink = kwargs["attn_sink"]
        if not isinstance(sink, torch.Tensor) or sink.dtype != torch.float32 \
                or tuple(sink.shape) != (heads,):
            return f"attn_sink is {_desc(sink)}, expected float32 [{heads}]"
        extras = [kwargs.get(k) for k in ("extra_k_cache", "extra_indices_in_kvcache",
                                          "extra_topk_length")]
        if any(e is not None for e in extras):
            if any(e is None for e in extras):
                return "extra_k_cache, extra_indices_in_kvcache and extra_topk_length are not all given"
            problem = _v4_cache_problem("extra_k_cache", extras[0]) \
                or _index_problem("extra_indices_in_kvcache", extras[1], T) \
                or _length_problem("extra_topk_length", extras[2], T)
            if problem:
                return problem
        for name in ("k_cache", "indices", "topk_length", "attn_sink", "extra_k_cache",
                     "extra_indices_in_kvcache", "extra_topk_length"):
            value = kwargs.get(name)
            if value is not None and value.device != q.device:
                return f"{name} is on {value.device}, q on {q.device}"
        return None

    def describe(self, args, kwargs) -> str:
        q = kwargs["q"]
        extra = kwargs.get("extra_k_cache")
        scope = "SWA only" if extra is None else f"SWA + extra (page size {extra.shape[1]})"
        return f"T={q.shape[0]}, H={q.shape[2]}, {scope}"


def _v4_cache_problem(name: str, cache) -> Optional[str]:
    import torch

    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or tuple(cache.shape[2:]) != (1, 584) \
            or cache.element_size() != 1:
        return f"{name} is {_desc(cache)}, expected a 1-byte [pages, page_size, 1, 584] V4 cache"
    expected = _v4_page_bytes(cache.shape[1])
    if cache.stride(0) != expected or cache.stride(3) != 1:
        return (f"{name} has strides {tuple(cache.stride())}, expected stride(0) = {expected} bytes "
                f"(V4 page of {cache.shape[1]} tokens) and stride(3) = 1")
    return None


def _index_problem(name: str, idx, T: int) -> Optional[str]:
    import torch

    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int32 or idx.dim() != 3 \
            or idx.shape[0] != T or idx.shape[1] != 1:
        return f"{name} is {_desc(idx)}, expected int32 [{T}, 1, width]"
    return None


def _length_problem(name: str, length, T: int) -> Optional[str]:
    import torch

    if not isinstance(length, torch.Tensor) or length.dtype != torch.int32 \
            or tuple(length.shape) != (T,):
        return f"{name} is {_desc(length)}, expected int32 [{T}]"
    return None


def _desc(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    return f"{str(getattr(value, 'dtype', '?')).replace('torch.', '')} {list(shape)}"
